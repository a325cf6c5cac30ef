// CUDA conv2d, conv2d_backward_input and conv2d_backward_weight (cuDNN, conv.cpp) against the CPU kernels:
// F32/F16/BF16; NCHW, channels-last and mixed layouts (the copies into a common layout); stride 2,
// asymmetric stride and padding, dilation 2, groups, depthwise, 1x1 and 7x7 kernels, batch of 1, odd sizes,
// an empty batch; benchmark mode (same results, one timing run per problem, then the cache);
// deterministic mode (bit-identical repeats); the TF32 switch. Skips without a CUDA device or without
// cuDNN in the build.
//
// Tolerances: the table's (core/tolerance.h), scaled because cuDNN may pick Winograd or FFT algorithms,
// whose transforms round intermediate values a direct dot product does not have: x4 for F32 (still
// ~4e-6 of the output's magnitude), x2 for F16/BF16 (the final rounding dominates). A wrong index or
// formula is off by O(1). Every F32 comparison runs with TF32 off (TF32 keeps 10 mantissa bits); sums stay
// within the table's n <= 256 terms (forward: C/groups * kH * kW; weight gradient: N * OH * OW).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

#define AF_SKIP_WITHOUT_CUDNN()                                                                        \
  do {                                                                                                 \
    AF_SKIP_WITHOUT_CUDA();                                                                            \
    if (::ampforge::cuda::cudnn_version() == 0) GTEST_SKIP() << "this build has no cuDNN";             \
  } while (0)

// Restores the cuDNN switches at scope exit.
struct CudnnSwitches {
  bool tf32 = cuda::cudnn_allow_tf32(), bench = cuda::cudnn_benchmark(), det = cuda::cudnn_deterministic();
  ~CudnnSwitches() {
    cuda::set_cudnn_allow_tf32(tf32);
    cuda::set_cudnn_benchmark(bench);
    cuda::set_cudnn_deterministic(det);
  }
};

double scale_for(DType dt) { return dt == DType::F32 ? 4.0 : 2.0; }

Conv2dAttrs make_attrs(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh = 1, int64_t dw = 1,
                       int64_t groups = 1) {
  Conv2dAttrs a;
  a.stride[0] = sh, a.stride[1] = sw;
  a.padding[0] = ph, a.padding[1] = pw;
  a.dilation[0] = dh, a.dilation[1] = dw;
  a.groups = groups;
  return a;
}

struct Case {
  const char* name;
  Shape x, w;
  Conv2dAttrs a;
};

const Case kCases[] = {
    {"3x3 pad 1", {2, 8, 9, 11}, {16, 8, 3, 3}, make_attrs(1, 1, 1, 1)},
    {"3x3 stride 2", {2, 6, 13, 10}, {8, 6, 3, 3}, make_attrs(2, 2, 1, 1)},
    {"asymmetric stride and padding", {1, 4, 12, 9}, {6, 4, 3, 2}, make_attrs(2, 1, 1, 0)},
    {"dilation 2", {2, 5, 11, 10}, {7, 5, 3, 3}, make_attrs(1, 1, 2, 2, 2, 2)},
    {"groups 2", {2, 8, 10, 10}, {12, 4, 3, 3}, make_attrs(1, 1, 1, 1, 1, 1, 2)},
    {"depthwise", {2, 12, 11, 9}, {12, 1, 3, 3}, make_attrs(1, 1, 1, 1, 1, 1, 12)},
    {"depthwise 5x5, multiplier 2", {1, 6, 8, 8}, {12, 1, 5, 5}, make_attrs(1, 1, 2, 2, 1, 1, 6)},
    {"1x1", {3, 16, 7, 7}, {24, 16, 1, 1}, make_attrs(1, 1, 0, 0)},
    {"1x1 stride 2", {2, 16, 9, 9}, {8, 16, 1, 1}, make_attrs(2, 2, 0, 0)},
    {"7x7 stride 2 pad 3", {1, 3, 23, 21}, {8, 3, 7, 7}, make_attrs(2, 2, 3, 3)},
    {"batch 1, odd sizes", {1, 3, 5, 7}, {5, 3, 3, 3}, make_attrs(1, 1, 0, 0)},
    {"one output pixel", {2, 4, 3, 3}, {6, 4, 3, 3}, make_attrs(1, 1, 0, 0)},
};

// t laid out channels-last (or contiguous), made on t's own device (a transfer would make it dense again).
Tensor laid_out(const Tensor& t, bool channels_last) {
  return ops::contiguous(t, channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
}

// Forward (with and without bias), backward input and backward weight of one case on CUDA vs CPU, with x /
// grad_out laid out per `x_cl` and the weight per `w_cl`.
void check_case(const Case& c, DType dt, bool x_cl, bool w_cl) {
  const std::string what = std::string(c.name) + " " + std::string(dtype_name(dt)) +
                           (x_cl ? " x channels-last" : " x NCHW") + (w_cl ? ", w channels-last" : ", w NCHW");
  SCOPED_TRACE(what);
  const double s = scale_for(dt);
  const Shape ys = ops::conv2d_output_shape(c.x, c.w, c.a);
  const Tensor x = random_cpu(c.x, dt, 600), w = random_cpu(c.w, dt, 601), b = random_cpu(Shape{c.w[0]}, dt, 602);
  const Tensor gy = random_cpu(ys, dt, 603);
  const Tensor xc = laid_out(x, x_cl), wc = laid_out(w, w_cl), gyc = laid_out(gy, x_cl);
  const Tensor xg = laid_out(to_cuda(x), x_cl), wg = laid_out(to_cuda(w), w_cl), gyg = laid_out(to_cuda(gy), x_cl);

  expect_matches_cpu(ops::conv2d(xg, wg, to_cuda(b), c.a), ops::conv2d(xc, wc, b, c.a), "forward with bias " + what, s);
  expect_matches_cpu(ops::conv2d(xg, wg, Tensor(), c.a), ops::conv2d(xc, wc, Tensor(), c.a), "forward " + what, s);
  // the input gradient in the layout of x (the forward's choice) and in the other one
  for (bool gin_cl : {x_cl, !x_cl}) {
    const MemoryFormat f = gin_cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    const Tensor got = ops::conv2d_backward_input(gyg, wg, c.x, c.a, f);
    expect_matches_cpu(got, ops::conv2d_backward_input(gyc, wc, c.x, c.a, f),
                       std::string("backward input") + (gin_cl ? " (channels-last) " : " (NCHW) ") + what, s);
    EXPECT_TRUE(got.is_contiguous(f)) << "backward input keeps the requested layout: " << what;
  }
  expect_matches_cpu(ops::conv2d_backward_weight(gyg, xg, c.w, c.a), ops::conv2d_backward_weight(gyc, xc, c.w, c.a),
                     "backward weight " + what, s);
  // grad_out and x in different layouts (one is copied into the other's)
  expect_matches_cpu(ops::conv2d_backward_weight(laid_out(gyg, !x_cl), xg, c.w, c.a),
                     ops::conv2d_backward_weight(laid_out(gyc, !x_cl), xc, c.w, c.a), "backward weight, mixed " + what,
                     s);
}

}  // namespace

TEST(CudaConv, MatchesCpuNchw) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Case& c : kCases) check_case(c, dt, false, false);
}

TEST(CudaConv, MatchesCpuChannelsLast) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Case& c : kCases) check_case(c, dt, true, true);
}

TEST(CudaConv, MatchesCpuMixedLayouts) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Case& c : kCases) {
      check_case(c, dt, true, false);  // channels-last activations, contiguous weight (the weight is copied)
      check_case(c, dt, false, true);  // a channels-last weight makes the output channels-last (x is copied)
    }
}

TEST(CudaConv, StridedWeightAndBias) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor x = random_cpu(Shape{2, 6, 8, 8}, dt, 610);
    // every other output channel of a wider weight, and every other element of a longer bias
    const Tensor wwide = random_cpu(Shape{16, 6, 3, 3}, dt, 611), bwide = random_cpu(Shape{16}, dt, 612);
    const Tensor w = ops::slice(wwide, 0, 0, 16, 2), b = ops::slice(bwide, 0, 0, 16, 2);
    const Tensor wg = ops::slice(to_cuda(wwide), 0, 0, 16, 2), bg = ops::slice(to_cuda(bwide), 0, 0, 16, 2);
    expect_matches_cpu(ops::conv2d(to_cuda(x), wg, bg, a), ops::conv2d(x, w, b, a),
                       "strided weight and bias " + std::string(dtype_name(dt)), scale_for(dt));
  }
}

TEST(CudaConv, EmptyBatch) {
  AF_SKIP_WITHOUT_CUDNN();
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  const Tensor x = ops::zeros(Shape{0, 3, 5, 5}), w = random_cpu(Shape{4, 3, 3, 3}, DType::F32, 620);
  const Tensor gy = ops::zeros(Shape{0, 4, 5, 5});
  expect_matches_cpu(ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), a), ops::conv2d(x, w, Tensor(), a), "forward N = 0");
  expect_matches_cpu(ops::conv2d_backward_input(to_cuda(gy), to_cuda(w), x.shape(), a),
                     ops::conv2d_backward_input(gy, w, x.shape(), a), "backward input N = 0");
  expect_matches_cpu(ops::conv2d_backward_weight(to_cuda(gy), to_cuda(x), w.shape(), a),
                     ops::conv2d_backward_weight(gy, x, w.shape(), a), "backward weight N = 0 (zeros)");
}

TEST(CudaConv, UnsupportedDtypeIsNotImplemented) {
  AF_SKIP_WITHOUT_CUDNN();
  const Tensor x = random_cpu(Shape{1, 2, 4, 4}, DType::F64, 630), w = random_cpu(Shape{2, 2, 3, 3}, DType::F64, 631);
  try {
    (void)ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), make_attrs(1, 1, 0, 0));
    FAIL() << "F64 conv2d on CUDA should raise NotImplemented";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(dtype_name(DType::F64))), std::string::npos) << e.what();
  }
}

TEST(CudaConv, Tf32Switch) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  if (std::getenv("AMPFORGE_CUDNN_ALLOW_TF32") == nullptr) {
    EXPECT_TRUE(cuda::cudnn_allow_tf32()) << "TF32 must be on by default for cuDNN (torch.backends.cudnn.allow_tf32)";
  }
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  const Tensor x = random_cpu(Shape{2, 16, 12, 12}, DType::F32, 640);
  const Tensor w = random_cpu(Shape{32, 16, 3, 3}, DType::F32, 641);
  const Tensor ref = ops::conv2d(x, w, Tensor(), a);
  cuda::set_cudnn_allow_tf32(true);
  // TF32 keeps 10 mantissa bits, like F16: compared with the F16 row of the table (x2 as above).
  expect_matches_cpu(ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), a), ref, "conv2d with TF32",
                     2.0 * tolerance(DType::F16).rtol / tolerance(DType::F32).rtol);
  cuda::set_cudnn_allow_tf32(false);
  expect_matches_cpu(ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), a), ref, "conv2d with TF32 off",
                     scale_for(DType::F32));
}

TEST(CudaConv, BenchmarkModeMatchesAndCaches) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  cuda::set_cudnn_benchmark(true);
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  for (bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channels-last" : "NCHW");
    const Tensor x = random_cpu(Shape{2, 12, 10, 10}, DType::F32, 650);
    const Tensor w = random_cpu(Shape{20, 12, 3, 3}, DType::F32, 651);
    const Tensor b = random_cpu(Shape{20}, DType::F32, 652), gy = random_cpu(Shape{2, 20, 10, 10}, DType::F32, 653);
    const Tensor xg = laid_out(to_cuda(x), cl), wg = laid_out(to_cuda(w), cl), gyg = laid_out(to_cuda(gy), cl);
    const Tensor yref = ops::conv2d(x, w, b, a), giref = ops::conv2d_backward_input(gy, w, x.shape(), a),
                 gwref = ops::conv2d_backward_weight(gy, x, w.shape(), a);

    const int64_t runs0 = cuda::cudnn_benchmark_runs(), cache0 = cuda::cudnn_cache_size();
    const Tensor y1 = ops::conv2d(xg, wg, to_cuda(b), a);
    const Tensor gi1 = ops::conv2d_backward_input(gyg, wg, x.shape(), a);
    const Tensor gw1 = ops::conv2d_backward_weight(gyg, xg, w.shape(), a);
    expect_matches_cpu(y1, yref, "benchmarked forward", scale_for(DType::F32));
    expect_matches_cpu(gi1, giref, "benchmarked backward input", scale_for(DType::F32));
    expect_matches_cpu(gw1, gwref, "benchmarked backward weight", scale_for(DType::F32));
    EXPECT_EQ(cuda::cudnn_benchmark_runs() - runs0, 3) << "one timing run per direction";
    EXPECT_EQ(cuda::cudnn_cache_size() - cache0, 3) << "one cached choice per direction";

    // the same problems again: cache hits, no timing, the same algorithms
    const Tensor y2 = ops::conv2d(xg, wg, to_cuda(b), a);
    const Tensor gi2 = ops::conv2d_backward_input(gyg, wg, x.shape(), a);
    const Tensor gw2 = ops::conv2d_backward_weight(gyg, xg, w.shape(), a);
    EXPECT_EQ(cuda::cudnn_benchmark_runs() - runs0, 3) << "second calls must hit the cache";
    EXPECT_EQ(cuda::cudnn_cache_size() - cache0, 3);
    expect_matches_cpu(y2, yref, "forward from the cache", scale_for(DType::F32));
    expect_matches_cpu(gi2, giref, "backward input from the cache", scale_for(DType::F32));
    expect_matches_cpu(gw2, gwref, "backward weight from the cache", scale_for(DType::F32));
    expect_identical(y2, to_cpu(y1), "forward repeated with the cached (deterministic) algorithm");
  }
}

TEST(CudaConv, DeterministicModeIsBitIdentical) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_allow_tf32(false);
  cuda::set_cudnn_deterministic(true);
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  for (bool bench : {false, true}) {
    cuda::set_cudnn_benchmark(bench);
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      const std::string what = std::string(dtype_name(dt)) + (bench ? " benchmark" : " heuristics");
      // weight-gradient sums over N * OH * OW = 256 terms: the F32 table's bound
      const Tensor x = random_cpu(Shape{4, 16, 8, 8}, dt, 660), w = random_cpu(Shape{16, 16, 3, 3}, dt, 661);
      const Tensor gy = random_cpu(Shape{4, 16, 8, 8}, dt, 662);
      const Tensor xg = to_cuda(x), wg = to_cuda(w), gyg = to_cuda(gy);
      const Tensor gw1 = ops::conv2d_backward_weight(gyg, xg, w.shape(), a);
      const Tensor gw2 = ops::conv2d_backward_weight(gyg, xg, w.shape(), a);
      const Tensor gi1 = ops::conv2d_backward_input(gyg, wg, x.shape(), a);
      const Tensor gi2 = ops::conv2d_backward_input(gyg, wg, x.shape(), a);
      const Tensor y1 = ops::conv2d(xg, wg, Tensor(), a), y2 = ops::conv2d(xg, wg, Tensor(), a);
      expect_identical(gw2, to_cpu(gw1), "deterministic backward weight " + what);
      expect_identical(gi2, to_cpu(gi1), "deterministic backward input " + what);
      expect_identical(y2, to_cpu(y1), "deterministic forward " + what);
      expect_matches_cpu(gw1, ops::conv2d_backward_weight(gy, x, w.shape(), a), "backward weight " + what,
                         scale_for(dt));
      expect_matches_cpu(gi1, ops::conv2d_backward_input(gy, w, x.shape(), a), "backward input " + what, scale_for(dt));
    }
  }
}

// A 16-bit NCHW problem whose heuristics query answers CUDNN_STATUS_BAD_PARAM (forced here, as cuDNN 9's
// legacy API does for some layouts) is retried channels-last and gives the CPU's result.
TEST(CudaConv, SixteenBitNchwRetriesChannelsLastOnBadParam) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_benchmark(false);
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  for (DType dt : {DType::F16, DType::BF16}) {
    // a shape no other test uses, so that no algorithm is cached for it yet
    const Tensor x = random_cpu(Shape{3, 10, 9, 11}, dt, 670), w = random_cpu(Shape{14, 10, 3, 3}, dt, 671);
    const int64_t retries = cuda::cudnn_layout_retries();
    cuda::set_cudnn_heuristic_bad_param_for_testing(1);
    const Tensor y = ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), a);
    cuda::set_cudnn_heuristic_bad_param_for_testing(0);
    EXPECT_EQ(cuda::cudnn_layout_retries(), retries + 1) << "one retry, in channels-last";
    EXPECT_EQ(y.suggest_memory_format(), MemoryFormat::Contiguous) << "the output keeps its NCHW layout";
    expect_matches_cpu(y, ops::conv2d(x, w, Tensor(), a), std::string("retried forward ") + dtype_name(dt).data(),
                       scale_for(dt));
  }
  // F32 NCHW has no other layout: the forced BAD_PARAM surfaces as NotImplemented naming the query's answer.
  const Tensor x = random_cpu(Shape{3, 10, 9, 13}, DType::F32, 672), w = random_cpu(Shape{14, 10, 3, 3}, DType::F32, 673);
  cuda::set_cudnn_heuristic_bad_param_for_testing(1);
  try {
    (void)ops::conv2d(to_cuda(x), to_cuda(w), Tensor(), a);
    cuda::set_cudnn_heuristic_bad_param_for_testing(0);
    FAIL() << "expected NotImplemented";
  } catch (const Error& e) {
    cuda::set_cudnn_heuristic_bad_param_for_testing(0);
    EXPECT_EQ(e.kind(), ErrorKind::NotImplemented) << e.what();
    EXPECT_NE(std::string(e.what()).find("BAD_PARAM"), std::string::npos) << e.what();
  }
}

// Inside a CUDA graph capture, benchmark mode refuses a problem it has not timed yet (timing runs and waits
// for kernels) with an error that says what to do; a problem timed before the capture runs from the cache.
TEST(CudaConv, BenchmarkModeRefusesToTimeInsideACapture) {
  AF_SKIP_WITHOUT_CUDNN();
  CudnnSwitches keep;
  cuda::set_cudnn_benchmark(true);
  const Conv2dAttrs a = make_attrs(1, 1, 1, 1);
  const Tensor x = to_cuda(random_cpu(Shape{2, 6, 12, 12}, DType::F32, 680));
  const Tensor w = to_cuda(random_cpu(Shape{8, 6, 3, 3}, DType::F32, 681));
  const Tensor w_new = to_cuda(random_cpu(Shape{9, 6, 3, 3}, DType::F32, 682));
  const Tensor y_eager = ops::conv2d(x, w, Tensor(), a);  // timed and cached eagerly
  cuda::synchronize();
  cuda::Graph g(0);
  g.capture_begin();
  Tensor y_captured;
  std::string refused;
  try {
    y_captured = ops::conv2d(x, w, Tensor(), a);  // cached: captured
    (void)ops::conv2d(x, w_new, Tensor(), a);    // never timed: refused
  } catch (const Error& e) {
    refused = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
  }
  g.capture_end();  // nothing that invalidates the capture ran
  EXPECT_NE(refused.find("benchmark mode cannot time algorithms inside a CUDA graph capture"), std::string::npos)
      << refused;
  g.replay();
  expect_identical(y_captured, to_cpu(y_eager), "the captured convolution replays the eager result");
}
