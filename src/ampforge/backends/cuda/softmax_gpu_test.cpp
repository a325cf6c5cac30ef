// CUDA softmax, log_softmax, cross_entropy, bce_with_logits and their backward kernels against the CPU
// kernels: every dim (the warp-per-row, block-per-row and column kernels), long rows, -inf and NaN,
// reductions, ignore_index, label smoothing, (N, C, d...) logits, and the deferred error for an
// out-of-range target. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

TEST(CudaSoftmax, ForwardAndBackwardOnEveryDim) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Shape s{5, 6, 7};
    Tensor x = random_cpu(s, dt, 200, 3.0);
    Tensor g = random_cpu(s, dt, 201);
    for (int64_t dim : {0, 1, 2, -1}) {
      const std::string what = std::string(dtype_name(dt)) + " dim " + std::to_string(dim);
      Tensor y = ops::softmax(x, dim), ly = ops::log_softmax(x, dim);
      expect_matches_cpu(ops::softmax(to_cuda(x), dim), y, "softmax " + what);
      expect_matches_cpu(ops::log_softmax(to_cuda(x), dim), ly, "log_softmax " + what);
      expect_matches_cpu(ops::softmax_backward(to_cuda(g), to_cuda(y), dim), ops::softmax_backward(g, y, dim),
                         "softmax_backward " + what);
      expect_matches_cpu(ops::log_softmax_backward(to_cuda(g), to_cuda(ly), dim), ops::log_softmax_backward(g, ly, dim),
                         "log_softmax_backward " + what);
    }
  }
}

TEST(CudaSoftmax, LongRowsAndSpecialValues) {
  AF_SKIP_WITHOUT_CUDA();
  // Warp rows up to 1024, block rows above, forward and backward. The long rows' sums need double accumulation
  // to stay inside the F32 tolerance (log_softmax_backward's sum(g) over 5000 elements).
  for (DType dt : {DType::F32, DType::F16})
    for (int64_t D : {1, 31, 1024, 1025, 5000}) {
      const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(D);
      Tensor x = random_cpu(Shape{3, D}, dt, 202, 4.0);
      Tensor g = random_cpu(Shape{3, D}, dt, 212);
      Tensor y = ops::softmax(x, 1), ly = ops::log_softmax(x, 1);
      expect_matches_cpu(ops::softmax(to_cuda(x), 1), y, "softmax " + what);
      expect_matches_cpu(ops::log_softmax(to_cuda(x), 1), ly, "log_softmax " + what);
      expect_matches_cpu(ops::softmax_backward(to_cuda(g), to_cuda(y), 1), ops::softmax_backward(g, y, 1),
                         "softmax_backward " + what);
      expect_matches_cpu(ops::log_softmax_backward(to_cuda(g), to_cuda(ly), 1), ops::log_softmax_backward(g, ly, 1),
                         "log_softmax_backward " + what);
    }
  Tensor sp = Tensor::from_vector<float>({-INFINITY, 0, 1, -INFINITY, 1000, 1000, NAN, 1, 2}, Shape{3, 3});
  expect_matches_cpu(ops::softmax(to_cuda(sp), 1), ops::softmax(sp, 1), "softmax with -inf, large values, NaN");
  expect_matches_cpu(ops::log_softmax(to_cuda(sp), 1), ops::log_softmax(sp, 1), "log_softmax with -inf, large, NaN");
}

namespace {

// Cross entropy's loss, log-sum-exp and input gradient on CUDA against the CPU, for targets `t` over C classes:
// every dtype x reduction, with and without label smoothing. Logits from `seed`, the output gradient from seed + 1.
void expect_cross_entropy_matches_cpu(const Tensor& t, int64_t C, std::initializer_list<DType> dtypes,
                                      std::initializer_list<Reduction> reductions, uint64_t seed,
                                      const std::string& label) {
  for (DType dt : dtypes)
    for (Reduction red : reductions)
      for (double eps : {0.0, 0.1}) {
        Tensor x = random_cpu(Shape{t.numel(), C}, dt, seed, 2.0);
        CrossEntropyAttrs at;
        at.reduction = red;
        at.label_smoothing = eps;
        const std::string what = label + std::string(dtype_name(dt)) + " reduction " +
                                 std::to_string(static_cast<int>(red)) + " eps " + std::to_string(eps);
        auto c = ops::cross_entropy(x, t, at);
        auto g = ops::cross_entropy(to_cuda(x), to_cuda(t), at);
        expect_matches_cpu(g.loss, c.loss, "cross_entropy loss " + what);
        expect_matches_cpu(g.lse, c.lse, "cross_entropy lse " + what);
        Tensor go = red == Reduction::None ? random_cpu(c.loss.shape(), dt, seed + 1) : ops::full(Shape{}, 1.5, dt);
        expect_matches_cpu(ops::cross_entropy_backward(to_cuda(go), to_cuda(x), to_cuda(t), g.lse, at),
                           ops::cross_entropy_backward(go, x, t, c.lse, at), "cross_entropy_backward " + what);
      }
}

}  // namespace

TEST(CudaCrossEntropy, ReductionsIgnoreIndexSmoothing) {
  AF_SKIP_WITHOUT_CUDA();
  const int64_t N = 37, C = 11;
  std::vector<int64_t> tv;
  for (int64_t i = 0; i < N; ++i) tv.push_back(i % 7 == 3 ? -100 : (i * 5) % C);
  expect_cross_entropy_matches_cpu(Tensor::from_vector<int64_t>(tv), C, {DType::F32, DType::F16, DType::BF16},
                                   {Reduction::None, Reduction::Mean, Reduction::Sum}, 203, "");
}

TEST(CudaCrossEntropy, ManyClassesWarpRows) {
  AF_SKIP_WITHOUT_CUDA();
  // C > 32: each lane of the row's warp walks several classes (the test above has C = 11 < 32 lanes).
  const int64_t N = 9, C = 1000;
  std::vector<int64_t> tv;
  for (int64_t i = 0; i < N; ++i) tv.push_back(i == 4 ? -100 : (i * 337) % C);
  expect_cross_entropy_matches_cpu(Tensor::from_vector<int64_t>(tv), C, {DType::F32, DType::BF16},
                                   {Reduction::None, Reduction::Mean}, 213, "C=1000 ");
}

TEST(CudaCrossEntropy, SpatialLogitsAndAllIgnored) {
  AF_SKIP_WITHOUT_CUDA();
  // (N, C, H, W): rows strided by H * W (the thread-per-row kernel)
  Tensor x = random_cpu(Shape{2, 5, 3, 4}, DType::F32, 205, 2.0);
  std::vector<int64_t> tv;
  for (int i = 0; i < 24; ++i) tv.push_back(i % 5);
  Tensor t = Tensor::from_vector<int64_t>(tv, Shape{2, 3, 4});
  for (Reduction red : {Reduction::None, Reduction::Mean}) {
    CrossEntropyAttrs at;
    at.reduction = red;
    auto c = ops::cross_entropy(x, t, at);
    auto g = ops::cross_entropy(to_cuda(x), to_cuda(t), at);
    expect_matches_cpu(g.loss, c.loss, "spatial cross_entropy");
    Tensor go = red == Reduction::None ? random_cpu(c.loss.shape(), DType::F32, 206) : ops::full(Shape{}, 1.0);
    expect_matches_cpu(ops::cross_entropy_backward(to_cuda(go), to_cuda(x), to_cuda(t), g.lse, at),
                       ops::cross_entropy_backward(go, x, t, c.lse, at), "spatial cross_entropy_backward");
  }
  // every target ignored: mean is 0/0 = NaN on both
  Tensor ign = ops::full(Shape{4}, -100, DType::I64);
  Tensor x2 = random_cpu(Shape{4, 3}, DType::F32, 207);
  expect_matches_cpu(ops::cross_entropy(to_cuda(x2), to_cuda(ign), {}).loss, ops::cross_entropy(x2, ign, {}).loss,
                     "all ignored");
}

TEST(CudaCrossEntropy, OutOfRangeTargetIsReportedAtTheNextSync) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor x = random_cpu(Shape{4, 3}, DType::F32, 208);
  Tensor t = Tensor::from_vector<int64_t>({0, 1, 7, 2});
  auto r = ops::cross_entropy(to_cuda(x), to_cuda(t), {});  // no host sync: cannot throw here
  try {
    (void)r.loss.item();
    FAIL() << "expected the out-of-range target to be reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cross_entropy"), std::string::npos) << e.what();
  }
  // reported once, then the device is usable again
  EXPECT_NO_THROW(cuda::synchronize(0));
  EXPECT_NEAR(to_cuda(ops::ones(Shape{2})).tolist<float>()[1], 1.0f, 0.0f);
}

TEST(CudaBce, WithLogitsForwardAndBackward) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      Tensor x = random_cpu(Shape{13, 29}, dt, 210, 4.0);
      Tensor t = ops::to_dtype(ops::rand(Shape{13, 29}, DType::F32), dt);
      const std::string what = std::string(dtype_name(dt)) + " reduction " + std::to_string(static_cast<int>(red));
      Tensor c = ops::bce_with_logits(x, t, red);
      expect_matches_cpu(ops::bce_with_logits(to_cuda(x), to_cuda(t), red), c, "bce_with_logits " + what);
      Tensor go = red == Reduction::None ? random_cpu(c.shape(), dt, 211) : ops::full(Shape{}, 0.75, dt);
      expect_matches_cpu(ops::bce_with_logits_backward(to_cuda(go), to_cuda(x), to_cuda(t), red),
                         ops::bce_with_logits_backward(go, x, t, red), "bce_with_logits_backward " + what);
    }
}
