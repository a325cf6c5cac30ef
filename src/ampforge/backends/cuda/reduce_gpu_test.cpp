// CUDA reductions against the CPU kernels: every reduction kind over single and multiple dims, keepdim,
// inner and outer layouts, non-contiguous inputs, long reductions split across blocks, NaN and tie rules
// of amax/argmax, var's correction and accuracy far from zero, empty reductions. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>

#include "ampforge/backends/cuda/gpu_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

const OpId kKinds[] = {OpId::sum, OpId::mean, OpId::amax, OpId::amin, OpId::argmax, OpId::argmin, OpId::var};

// x: the CPU input; gx: the same values and layout on the device (default: to_cuda(x), dense).
void check(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const std::string& what,
           double factor = 1.0, Tensor gx = Tensor()) {
  if (!gx.defined()) gx = to_cuda(x);
  ASSERT_EQ(gx.strides(), x.strides()) << what;
  for (OpId op : kKinds) {
    Tensor c = ops::reduce(op, x, dims, keepdim);
    Tensor g = ops::reduce(op, gx, dims, keepdim);
    std::string d;
    for (int64_t v : dims) d += std::to_string(v) + ",";
    expect_matches_cpu(g, c, std::string(op_name(op)) + " over {" + d + "} " + (keepdim ? "keepdim " : "") + what,
                       factor);
  }
}

}  // namespace

TEST(CudaReduce, EveryKindOverEveryDimSet) {
  AF_SKIP_WITHOUT_CUDA();
  const Shape s{6, 7, 9, 5};
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {3}, {0, 1}, {1, 3}, {0, 2}, {2, 3}, {0, 1, 2, 3}, {-1}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    Tensor x = random_cpu(s, dt, 100);
    for (const auto& dims : dim_sets)
      for (bool keepdim : {false, true}) check(x, dims, keepdim, std::string(dtype_name(dt)));
  }
}

TEST(CudaReduce, NonContiguousAndChannelsLastInputs) {
  AF_SKIP_WITHOUT_CUDA();
  // layouts are made on each device (a transfer makes tensors dense)
  Tensor x = random_cpu(Shape{8, 12, 10}, DType::F32, 101);
  Tensor xt = ops::permute(x, {2, 0, 1}), gxt = ops::permute(to_cuda(x), {2, 0, 1});  // permuted strides
  for (const auto& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}})
    check(xt, dims, false, "permuted view", 1.0, gxt);
  Tensor img = ops::contiguous(random_cpu(Shape{4, 6, 5, 7}, DType::F32, 102), MemoryFormat::ChannelsLast);
  for (const auto& dims : std::vector<std::vector<int64_t>>{{1}, {0, 2, 3}, {2, 3}}) check(img, dims, true, "channels_last");
  Tensor base = random_cpu(Shape{9, 40}, DType::F32, 103);
  Tensor sl = ops::slice(base, 1, 1, 40, 3), gsl = ops::slice(to_cuda(base), 1, 1, 40, 3);
  check(sl, {1}, false, "strided slice", 1.0, gsl);
  check(sl, {0}, false, "strided slice", 1.0, gsl);
}

TEST(CudaReduce, LongReductionsSplitAcrossBlocks) {
  AF_SKIP_WITHOUT_CUDA();
  // Sums of n terms: the comparison's F32 factor assumes n <= 256 (core/tolerance.h); for longer sums the
  // error grows like sqrt(n) u on both sides, so the bound is scaled by sqrt(n / 256).
  Tensor full = random_cpu(Shape{3 << 20}, DType::F32, 104);
  check(full, {}, false, "3M elements, full", std::sqrt((3 << 20) / 256.0));
  Tensor outer = random_cpu(Shape{1 << 16, 24}, DType::F32, 105);  // reduce the outer dim: columns
  check(outer, {0}, false, "65536 x 24 over dim 0", std::sqrt(65536 / 256.0));
  Tensor inner = random_cpu(Shape{3, 1 << 18}, DType::BF16, 106);
  // BF16 outputs: the F32 accumulation error (~sqrt(n) 2^-24) stays far below one BF16 rounding
  check(inner, {1}, false, "3 x 262144 over dim 1 (BF16)");
}

TEST(CudaReduce, NanTiesAndEdgeCases) {
  AF_SKIP_WITHOUT_CUDA();
  // ties: the first index wins; NaN: the first NaN wins and amax/amin propagate it
  Tensor t = Tensor::from_vector<float>({1, 3, 3, 0, 3, -1, 2, -1, 5, NAN, 5, NAN}, Shape{3, 4});
  check(t, {1}, false, "ties and NaN");
  check(t, {0}, false, "ties and NaN");
  Tensor big = ops::zeros(Shape{5000});
  ops::fill_(ops::slice(big, 0, 4000, 4001, 1), 7.0);
  ops::fill_(ops::slice(big, 0, 4500, 4501, 1), 7.0);
  EXPECT_EQ(ops::reduce(OpId::argmax, to_cuda(big), {}, false).item(), 4000.0) << "first of two maxima";
  // var with corrections
  Tensor v = random_cpu(Shape{4, 33}, DType::F32, 107, 3.0, 10.0);
  for (int64_t corr : {0, 1, 2}) {
    expect_matches_cpu(ops::reduce(OpId::var, to_cuda(v), {1}, false, corr), ops::reduce(OpId::var, v, {1}, false, corr),
                       "var correction " + std::to_string(corr));
  }
  // far from zero (|mean| >> std): float Welford states without a shift were 30-60x the tolerance off
  Tensor far = random_cpu(Shape{4, 4096}, DType::F32, 110, 1.0, 1e4);
  expect_matches_cpu(ops::reduce(OpId::var, to_cuda(far), {1}, false), ops::reduce(OpId::var, far, {1}, false),
                     "var at mean 1e4, std 1");
  Tensor one = random_cpu(Shape{4, 1}, DType::F32, 108);
  expect_matches_cpu(ops::reduce(OpId::var, to_cuda(one), {1}, false), ops::reduce(OpId::var, one, {1}, false),
                     "var of one element is NaN");
  // empty reductions: sum 0, mean NaN
  Tensor e = ops::zeros(Shape{3, 0});
  expect_matches_cpu(ops::sum(to_cuda(e), {1}), ops::sum(e, {1}), "empty sum");
  expect_matches_cpu(ops::mean(to_cuda(e), {1}), ops::mean(e, {1}), "empty mean");
  // no outputs
  Tensor z = ops::zeros(Shape{0, 4});
  expect_matches_cpu(ops::sum(to_cuda(z), {1}), ops::sum(z, {1}), "zero outputs");
  // the sum of integers and Bool is computed in F32 (ops/ converts), as on the CPU
  Tensor b = ops::compare(OpId::gt, random_cpu(Shape{100}, DType::F32, 109), ops::zeros(Shape{}));
  expect_matches_cpu(ops::sum(to_cuda(b)), ops::sum(b), "sum of Bool");
}
