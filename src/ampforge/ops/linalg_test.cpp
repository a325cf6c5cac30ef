// ops::linear edge cases the parity harness does not sample: empty reductions and empty batches.
#include <gtest/gtest.h>

#include "ampforge/ops/ops.h"

using namespace ampforge;

TEST(Linear, EmptyInnerDimensionGivesTheBias) {
  // K == 0: every output is the empty sum (0) plus the bias; the rows come from x's leading dims.
  Tensor x = ops::zeros({2, 3, 0});
  Tensor w = ops::zeros({4, 0});
  Tensor b = Tensor::from_vector<float>({1, 2, 3, 4});
  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  std::vector<float> want;
  for (int r = 0; r < 6; ++r)
    for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) want.push_back(v);
  EXPECT_EQ(ops::contiguous(y).tolist<float>(), want);
  EXPECT_EQ(ops::contiguous(ops::linear(x, w)).tolist<float>(), std::vector<float>(24, 0.0f));
}

TEST(Linear, EmptyBatchGivesAnEmptyOutput) {
  Tensor y = ops::linear(ops::zeros({0, 5}), ops::ones({3, 5}));
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
}
