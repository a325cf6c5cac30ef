// CUDA matmul and linear (cuBLASLt) against the CPU kernels (OpenBLAS): F32 with TF32 off (the default)
// and on, F16/BF16 with F32 accumulation; transposed, sliced and broadcast-batch operands; odd sizes; bias
// through the cuBLASLt epilogue and through the fallback (strided bias, one-row/one-column products).
// Skips without a CUDA device.
#include <gtest/gtest.h>

#include <tuple>

#include "ampforge/backends/cuda/gpu_testutil.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

Tensor transposed_layout(const Tensor& x) {  // same values, last two dims swapped in memory
  std::vector<int64_t> p(static_cast<size_t>(x.dim()));
  for (int i = 0; i < x.dim(); ++i) p[i] = i;
  std::swap(p[x.dim() - 1], p[x.dim() - 2]);
  return ops::permute(ops::contiguous(ops::permute(x, p)), p);
}

}  // namespace

TEST(CudaBlas, MatmulShapesLayoutsDtypes) {
  AF_SKIP_WITHOUT_CUDA();
  ASSERT_FALSE(cuda::allow_tf32()) << "TF32 must be off by default (PyTorch >= 1.12)";
  struct Case {
    Shape a, b;
  };
  // K <= 256 keeps the F32 comparison inside the tolerance table's assumption (core/tolerance.h)
  const Case cases[] = {{{1, 1}, {1, 1}},       {{17, 33}, {33, 9}},     {{64, 256}, {256, 48}}, {{5, 7}, {7}},
                        {{7}, {7, 5}},          {{3, 6, 8}, {3, 8, 5}},  {{4, 6, 8}, {8, 5}},    {{2, 1, 6, 8}, {3, 8, 5}},
                        {{31, 27}, {27, 13}}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Case& c : cases) {
      Tensor a = random_cpu(c.a, dt, 500), b = random_cpu(c.b, dt, 501);
      const std::string what = std::string(dtype_name(dt)) + " " + c.a.str() + " @ " + c.b.str();
      expect_matches_cpu(ops::matmul(to_cuda(a), to_cuda(b)), ops::matmul(a, b), "matmul " + what);
      if (a.dim() >= 2 && b.dim() >= 2) {
        // the transposed layouts made on each device (a transfer would make them dense again)
        expect_matches_cpu(ops::matmul(transposed_layout(to_cuda(a)), to_cuda(b)), ops::matmul(transposed_layout(a), b),
                           "matmul A^T layout " + what);
        expect_matches_cpu(ops::matmul(to_cuda(a), transposed_layout(to_cuda(b))), ops::matmul(a, transposed_layout(b)),
                           "matmul B^T layout " + what);
      }
    }
  // an operand with no unit stride (every other column of a wider matrix): copied before the GEMM
  Tensor wide = random_cpu(Shape{20, 30}, DType::F32, 502);
  Tensor a = ops::slice(wide, 1, 0, 30, 2);  // (20, 15), strides (30, 2)
  Tensor b = random_cpu(Shape{15, 11}, DType::F32, 503);
  expect_matches_cpu(ops::matmul(ops::slice(to_cuda(wide), 1, 0, 30, 2), to_cuda(b)), ops::matmul(a, b),
                     "matmul with a strided operand");
  // empty and K = 0
  expect_matches_cpu(ops::matmul(to_cuda(ops::zeros(Shape{0, 4})), to_cuda(ops::zeros(Shape{4, 3}))),
                     ops::matmul(ops::zeros(Shape{0, 4}), ops::zeros(Shape{4, 3})), "M = 0");
  expect_matches_cpu(ops::matmul(to_cuda(ops::zeros(Shape{2, 0})), to_cuda(ops::zeros(Shape{0, 3}))),
                     ops::matmul(ops::zeros(Shape{2, 0}), ops::zeros(Shape{0, 3})), "K = 0");
}

TEST(CudaBlas, Tf32Switch) {
  AF_SKIP_WITHOUT_CUDA();
  Tensor a = random_cpu(Shape{64, 64}, DType::F32, 504), b = random_cpu(Shape{64, 64}, DType::F32, 505);
  const Tensor ref = ops::matmul(a, b);
  cuda::set_allow_tf32(true);
  const Tensor tf = ops::matmul(to_cuda(a), to_cuda(b));
  cuda::set_allow_tf32(false);
  // TF32 keeps 10 mantissa bits, like F16: compare with the F16 row of the table.
  expect_matches_cpu(tf, ref, "matmul TF32", tolerance(DType::F16).rtol / tolerance(DType::F32).rtol);
  expect_matches_cpu(ops::matmul(to_cuda(a), to_cuda(b)), ref, "matmul F32 after switching TF32 off");
}

TEST(CudaBlas, Linear) {
  AF_SKIP_WITHOUT_CUDA();
  const std::tuple<int64_t, int64_t, int64_t> sizes[] = {{32, 64, 16}, {1, 5, 3}, {77, 33, 65}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool bias : {false, true})
      for (auto [M, K, N] : sizes) {
        Tensor x = random_cpu(Shape{M, K}, dt, 510), w = random_cpu(Shape{N, K}, dt, 511);
        Tensor bv = bias ? random_cpu(Shape{N}, dt, 512) : Tensor();
        const std::string what = std::string(dtype_name(dt)) + (bias ? " with bias " : " ") + std::to_string(M) + "x" +
                                 std::to_string(K) + "x" + std::to_string(N);
        expect_matches_cpu(ops::linear(to_cuda(x), to_cuda(w), bias ? to_cuda(bv) : Tensor()), ops::linear(x, w, bv),
                           "linear " + what);
        // a 3-D input and a transposed weight layout
        Tensor x3 = random_cpu(Shape{2, M, K}, dt, 513);
        expect_matches_cpu(ops::linear(to_cuda(x3), transposed_layout(to_cuda(w)), bias ? to_cuda(bv) : Tensor()),
                           ops::linear(x3, transposed_layout(w), bv), "linear 3-D, W^T layout " + what);
      }
}

// linear's bias on both paths of blas.cpp: the cuBLASLt epilogue (packed bias, also at an odd element offset,
// i.e. a pointer aligned to one element only, and with a weight that is first copied) and the fill + beta = 1
// fallback (strided bias, one-row and one-column products), in every dtype.
TEST(CudaBlas, LinearBiasEpilogueAndFallback) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::string dn(dtype_name(dt));
    struct Size {
      int64_t M, K, N;
    };
    for (const Size sz : {Size{64, 96, 128}, Size{33, 17, 65}, Size{2, 8, 2}, Size{1, 40, 24}, Size{24, 40, 1}}) {
      const auto [M, K, N] = sz;
      const std::string what = dn + " " + std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
      Tensor x = random_cpu(Shape{M, K}, dt, 520), w = random_cpu(Shape{N, K}, dt, 521);
      // packed bias
      Tensor b = random_cpu(Shape{N}, dt, 522);
      expect_matches_cpu(ops::linear(to_cuda(x), to_cuda(w), to_cuda(b)), ops::linear(x, w, b), "packed bias " + what);
      // packed bias starting one element into its buffer (the epilogue's pointer alignment is one element)
      Tensor bwide = random_cpu(Shape{N + 1}, dt, 523);
      expect_matches_cpu(ops::linear(to_cuda(x), to_cuda(w), ops::narrow(to_cuda(bwide), 0, 1, N)),
                         ops::linear(x, w, ops::narrow(bwide, 0, 1, N)), "offset bias " + what);
      // strided bias: every other element (fallback)
      Tensor b2 = random_cpu(Shape{2 * N}, dt, 524);
      expect_matches_cpu(ops::linear(to_cuda(x), to_cuda(w), ops::slice(to_cuda(b2), 0, 0, 2 * N, 2)),
                         ops::linear(x, w, ops::slice(b2, 0, 0, 2 * N, 2)), "strided bias " + what);
      // a weight without a unit stride (copied before the GEMM) with a packed bias
      Tensor wwide = random_cpu(Shape{N, 2 * K}, dt, 525);
      expect_matches_cpu(ops::linear(to_cuda(x), ops::slice(to_cuda(wwide), 1, 0, 2 * K, 2), to_cuda(b)),
                         ops::linear(x, ops::slice(wwide, 1, 0, 2 * K, 2), b), "copied weight, packed bias " + what);
    }
  }
}

// When cuBLASLt's heuristic finds no algorithm (forced here for one query; real for some misaligned views),
// the product is computed once more from packed, aligned copies: same result as the CPU.
TEST(CudaBlas, NoAlgorithmRetriesWithAlignedCopies) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const std::string dn(dtype_name(dt));
    // views at an odd element offset (2-byte aligned for 16-bit types), sizes no other test uses
    const Tensor abuf = random_cpu(Shape{1 + 19 * 23}, dt, 510), bbuf = random_cpu(Shape{1 + 23 * 29}, dt, 511);
    const Tensor a = ops::reshape(ops::slice(abuf, 0, 1, 1 + 19 * 23, 1), Shape{19, 23});
    const Tensor b = ops::reshape(ops::slice(bbuf, 0, 1, 1 + 23 * 29, 1), Shape{23, 29});
    const Tensor ag = ops::reshape(ops::slice(to_cuda(abuf), 0, 1, 1 + 19 * 23, 1), Shape{19, 23});
    const Tensor bg = ops::reshape(ops::slice(to_cuda(bbuf), 0, 1, 1 + 23 * 29, 1), Shape{23, 29});
    const int64_t retries = cuda::gemm_aligned_retries();
    cuda::set_gemm_no_algorithm_for_testing(1);
    const Tensor c = ops::matmul(ag, bg);
    cuda::set_gemm_no_algorithm_for_testing(0);
    EXPECT_EQ(cuda::gemm_aligned_retries(), retries + 1) << dn;
    expect_matches_cpu(c, ops::matmul(a, b), "matmul retried with aligned copies " + dn);
    // linear with a bias (epilogue path first: a forced miss there takes the bias fallback, then the retry)
    const Tensor W = random_cpu(Shape{31, 23}, dt, 512), bias = random_cpu(Shape{31}, dt, 513);
    cuda::set_gemm_no_algorithm_for_testing(2);
    const Tensor l = ops::linear(ag, to_cuda(W), to_cuda(bias));
    cuda::set_gemm_no_algorithm_for_testing(0);
    expect_matches_cpu(l, ops::linear(a, W, bias), "linear retried with aligned copies " + dn);
  }
}

// The first cuBLASLt call of a process may come inside a CUDA graph capture: the handle and workspace are
// made before the capture begins (Graph::capture_begin), so the capture holds only the GEMM. (Each ctest
// test runs in its own process, where this is the first matmul.)
TEST(CudaBlas, FirstMatmulInsideACapture) {
  AF_SKIP_WITHOUT_CUDA();
  const Tensor a = random_cpu(Shape{33, 40}, DType::F32, 520), b = random_cpu(Shape{40, 17}, DType::F32, 521);
  const Tensor ag = to_cuda(a), bg = to_cuda(b);
  cuda::synchronize();
  cuda::Graph g(0);
  g.capture_begin();
  const Tensor c = ops::matmul(ag, bg);
  g.capture_end();
  EXPECT_GE(g.num_kernel_nodes(), 1);
  g.replay();
  expect_matches_cpu(c, ops::matmul(a, b), "matmul captured first");
}
