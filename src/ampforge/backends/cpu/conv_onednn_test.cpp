// Tests of the oneDNN convolution path (conv_onednn.h) against the im2col path (conv.cpp), through the ops:
//   - AMPFORGE_CPU_CONV switches the path (the oneDNN execution counter moves, or does not), and a bad value
//     or "onednn" in a build without oneDNN is a clear error;
//   - forward, input gradient and weight gradient of both paths agree on random problems (strides, padding,
//     dilation, groups, depthwise, 1x1, NCHW and NHWC, channels-last weights) within the tolerance table of
//     core/tolerance.h: F32 at the F32 row, BF16 at the BF16 row;
//   - F32 and BF16 problems of those shapes in channels-last run on oneDNN wherever this CPU's oneDNN has a kernel
//     for them (ran_where_it_must: every direction on AVX-512; below it, a direction may be declined only for the
//     reason conv_onednn.cpp declines by design, which the decline names); F64 falls back, and so may NCHW
//     problems (oneDNN 2.6 has only gemm-based kernels for most of them);
//   - BF16 both ways (bf16_compute.h): on oneDNN's BF16 kernels, and as F32 on F32 copies, which gives exactly the
//     bits of the F32 problem on the converted operands, rounded to BF16.
// Without oneDNN in the build, the comparison tests skip and the error test checks the message.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ampforge/backends/cpu/conv_onednn.h"
#include "ampforge/backends/cpu/conv_test_util.h"
#include "ampforge/backends/cpu/matmul_onednn.h"
#include "ampforge/core/tolerance.h"
#include "ampforge/core/tolerance_testutil.h"
#include "ampforge/ops/ops.h"
#include "ampforge/util/env_test_util.h"
#include "ampforge/util/thread_pool.h"

using namespace ampforge;
using ampforge::testutil::conv_attrs;
using ampforge::testutil::ConvCase;
using ampforge::testutil::ScopedEnv;
using ampforge::testutil::within_tolerance;

namespace {

constexpr MemoryFormat kNCHW = MemoryFormat::Contiguous;
constexpr MemoryFormat kNHWC = MemoryFormat::ChannelsLast;

Generator& gen() {
  static Generator g(777);
  return g;
}

// Random normal values in dtype and layout mf (an exact copy with mf's strides, also for size-1 dims).
Tensor rnd(const Shape& s, DType dt, MemoryFormat mf = kNCHW) {
  Tensor v = ops::to_dtype(ops::randn(s, DType::F32, kCPU, &gen()), dt);
  Tensor o = Tensor::empty(s, dt, kCPU, mf);
  ops::copy_(o, v);
  return o;
}

// The reductions stay short (<= ~300 terms per output, per input-gradient and per weight-gradient element),
// the range the F32 row of the tolerance table is derived for.
const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> c = {
      {"3x3", 2, 8, 9, 8, 16, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 1), true},
      {"3x3_stride2", 2, 16, 10, 9, 8, 3, 3, conv_attrs(2, 2, 1, 1, 1, 1, 1), false},
      {"stem_7x7_stride2", 2, 3, 15, 14, 8, 7, 7, conv_attrs(2, 2, 3, 3, 1, 1, 1), true},
      {"dilation2", 1, 8, 10, 11, 8, 3, 3, conv_attrs(1, 1, 2, 2, 2, 2, 1), true},
      {"asymmetric", 2, 4, 9, 10, 6, 2, 3, conv_attrs(2, 1, 1, 0, 1, 2, 1), false},
      {"groups4", 2, 16, 7, 7, 32, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 4), true},
      {"depthwise", 2, 16, 8, 8, 16, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 16), true},
      {"depthwise_stride2", 2, 32, 9, 9, 32, 3, 3, conv_attrs(2, 2, 1, 1, 1, 1, 32), false},
      {"pointwise", 2, 32, 6, 5, 16, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), true},
      {"pointwise_stride2", 2, 16, 8, 8, 32, 1, 1, conv_attrs(2, 2, 0, 0, 1, 1, 1), false},
      {"pointwise_groups2", 2, 16, 4, 6, 8, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 2), true},
  };
  return c;
}

// Whether the implementation that ran the last problem (onednn_last_impl) names `part`, e.g. "wino" or "sgemm"; the
// message names the implementation either way.
::testing::AssertionResult last_impl_has(const char* part) {
  const std::string impl = cpu::onednn_last_impl();
  if (impl.find(part) != std::string::npos) return ::testing::AssertionSuccess() << "last implementation: " << impl;
  return ::testing::AssertionFailure() << "last implementation '" << impl << "' does not name '" << part << "'";
}

struct ConvRun {
  Tensor y, gx, gw;
  std::string impl[3];  // onednn_last_impl() after the forward, the input gradient, the weight gradient
};

// Whether oneDNN dispatches to AVX-512 here (the CPU's ISA, capped by ONEDNN_MAX_CPU_ISA).
bool onednn_avx512() { return cpu::onednn_conv_offer().isa.rfind("avx512", 0) == 0; }

// Whether each direction of a channels-last problem ran where it must on this CPU. Asked of oneDNN, not assumed:
//   - BF16 on oneDNN's own kernels (AMPFORGE_CPU_BF16=native) runs there where onednn_conv_offer().bf16 (AVX-512 in
//     oneDNN 2.6); elsewhere every direction is declined with "no implementation" and runs on im2col;
//   - F32 (and BF16 on F32 copies): on AVX-512 every direction of these problems has a direct kernel (the original
//     claim of this file, measured on Xeon and Zen 4/5 VMs); below it oneDNN 2.6 offers only its gemm-based kernel
//     for some directions (on AVX2: the 3-channel 7x7 stride-2 input gradient, dilated weight gradients, grouped
//     forwards, ...), which conv_onednn.cpp declines on purpose (slower than im2col). Such a decline must name the
//     kernel oneDNN offered ("declined: x64:gemm:jit" / "declined: ref:..."); any other reason (a descriptor
//     ampforge built wrongly: "no implementation", "rejected: ...") fails.
::testing::AssertionResult ran_where_it_must(const ConvRun& r, bool native_bf16) {
  const char* dirs[3] = {"forward", "grad_input", "grad_weight"};
  std::string bad;
  for (int d = 0; d < 3; ++d) {
    const std::string& impl = r.impl[d];
    const bool declined = impl.rfind("declined: ", 0) == 0 || impl.empty();
    bool ok;
    if (native_bf16) {
      ok = cpu::onednn_conv_offer().bf16 ? !declined : impl == "declined: no implementation";
    } else if (onednn_avx512()) {
      ok = !declined;
    } else {
      ok = !declined || impl.rfind("declined: x64:gemm", 0) == 0 || impl.rfind("declined: ref", 0) == 0;
    }
    if (!ok) bad += std::string(bad.empty() ? "" : "; ") + dirs[d] + " '" + impl + "'";
  }
  if (!bad.empty())
    return ::testing::AssertionFailure() << "not where it must run on oneDNN " << cpu::onednn_conv_offer().isa
                                         << (native_bf16 ? " (native BF16)" : "") << ": " << bad;
  return ::testing::AssertionSuccess();
}

// Forward and both gradients on the path AMPFORGE_CPU_CONV names; how many oneDNN executions that took.
ConvRun run_on(const char* path, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy,
           const Conv2dAttrs& a, int64_t* executions) {
  ScopedEnv env("AMPFORGE_CPU_CONV", path);
  const int64_t before = cpu::onednn_conv_executions();
  ConvRun r;
  r.y = ops::conv2d(x, w, b, a);
  r.impl[0] = cpu::onednn_last_impl();
  r.gx = ops::conv2d_backward_input(gy, w, x.shape(), a, ops::conv2d_memory_format(x, w));
  r.impl[1] = cpu::onednn_last_impl();
  r.gw = ops::conv2d_backward_weight(gy, x, w.shape(), a);
  r.impl[2] = cpu::onednn_last_impl();
  *executions = cpu::onednn_conv_executions() - before;
  return r;
}

// `depth`: how many times longer than ~300 terms the reductions are (the table's bound grows with it).
void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double depth = 1) {
  const ToleranceEntry t = tolerance(want.dtype());
  EXPECT_TRUE(within_tolerance(got, want, t.rtol * depth, t.atol * depth, "oneDNN", "im2col")) << what;
}

// A 3x3 convolution of x must raise an Error whose message contains `message` (what a bad setting says).
void expect_conv_error(const Tensor& x, const std::string& message) {
  Tensor w = rnd({x.size(1), x.size(1), 3, 3}, DType::F32);
  try {
    ops::conv2d(x, w, Tensor(), conv_attrs(1, 1, 1, 1, 1, 1, 1));
    ADD_FAILURE() << "no error; expected one saying '" << message << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(OneDnnConv, EnvVarChoosesThePath) {
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  Tensor x = rnd({2, 8, 6, 6}, DType::F32, kNHWC), w = rnd({8, 8, 3, 3}, DType::F32);
  Tensor gy = rnd({2, 8, 6, 6}, DType::F32, kNHWC);
  int64_t n = 0;
  run_on("im2col", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(n, 0) << "AMPFORGE_CPU_CONV=im2col ran oneDNN primitives";
  if (!cpu::onednn_built()) {
    ScopedEnv env("AMPFORGE_CPU_CONV", "onednn");
    try {
      ops::conv2d(x, w, Tensor(), a);
      ADD_FAILURE() << "AMPFORGE_CPU_CONV=onednn without oneDNN did not raise";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("this build has no oneDNN"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  }
  run_on("onednn", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(n, 3) << "AMPFORGE_CPU_CONV=onednn: forward and both gradients should each run one primitive";
  run_on("", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(n, 3) << "oneDNN is the default in a build with it";
  EXPECT_EQ(cpu::cpu_conv_path(), cpu::CpuConvPath::OneDnn);
}

TEST(OneDnnConv, BadEnvValueIsAnError) {
  ScopedEnv env("AMPFORGE_CPU_CONV", "winograd");
  expect_conv_error(rnd({1, 2, 4, 4}, DType::F32), "AMPFORGE_CPU_CONV=winograd: expected im2col or onednn");
}

TEST(OneDnnConv, MatchesIm2colF32AndBF16) {
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  // BF16 both ways (bf16_compute.h): oneDNN's BF16 kernels, and F32 kernels on F32 copies.
  const std::vector<std::pair<DType, const char*>> kinds{
      {DType::F32, ""}, {DType::BF16, "native"}, {DType::BF16, "f32"}};
  for (const ConvCase& c : cases())
    for (const auto& [dt, way] : kinds)
      for (MemoryFormat mf : {kNCHW, kNHWC})
        for (bool weight_cl : {false, true}) {
          const ScopedEnv bf16_way("AMPFORGE_CPU_BF16", *way ? std::optional<std::string>(way) : std::nullopt);
          const std::string what = fmt::format("{} {}{}{} {}{}", c.name, dtype_name(dt), *way ? " " : "", way,
                                               mf == kNHWC ? "NHWC" : "NCHW", weight_cl ? " channels-last weight" : "");
          const Shape xs{c.N, c.C, c.H, c.W}, ws{c.Co, c.C / c.a.groups, c.KH, c.KW};
          Tensor x = rnd(xs, dt, mf), w = rnd(ws, dt, weight_cl ? kNHWC : kNCHW);
          Tensor b = c.bias ? rnd({c.Co}, dt) : Tensor();
          // The output layout the op picks (channels-last when x or w is), so gy matches it as autograd's would.
          const MemoryFormat of = ops::conv2d_memory_format(x, w);
          Tensor gy = rnd(ops::conv2d_output_shape(xs, ws, c.a), dt, of);
          int64_t n_ref = 0, n_dnn = 0;
          const ConvRun ref = run_on("im2col", x, w, b, gy, c.a, &n_ref);
          const ConvRun got = run_on("onednn", x, w, b, gy, c.a, &n_dnn);
          EXPECT_EQ(n_ref, 0) << what;
          // Channels-last activations run on oneDNN's direct kernels where it has them; for plain NCHW ones oneDNN
          // 2.6 offers its gemm-based kernels, which conv_onednn.cpp declines (slower than im2col): those may run on
          // im2col.
          if (mf == kNHWC) {
            const bool native = dt == DType::BF16 && std::string(way) == "native";
            EXPECT_TRUE(ran_where_it_must(got, native)) << what;
            const int64_t ran = std::count_if(got.impl, got.impl + 3, [](const std::string& i) {
              return i.rfind("declined", 0) != 0;
            });
            EXPECT_EQ(n_dnn, ran) << what << ": the execution counter disagrees with the implementations named";
          }
          EXPECT_TRUE(got.y.is_contiguous(of)) << what;
          expect_close(got.y, ref.y, what + " forward");
          expect_close(got.gx, ref.gx, what + " grad_input");
          expect_close(got.gw, ref.gw, what + " grad_weight");
        }
}

TEST(OneDnnConv, WideChannelsOnTinyImagesAsResNet50Ends) {
  // ResNet-50's last stages at a 64x64 input (the parity test's size): hundreds to thousands of channels on 4x4
  // and 2x2 images, where blocking over channels, not pixels, carries the work.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  const std::vector<ConvCase> wide = {
      {"layer4.0.conv2", 2, 512, 4, 4, 512, 3, 3, conv_attrs(2, 2, 1, 1, 1, 1, 1), false},
      {"layer4.0.downsample", 2, 1024, 4, 4, 2048, 1, 1, conv_attrs(2, 2, 0, 0, 1, 1, 1), false},
      {"layer4.1.conv1", 2, 2048, 2, 2, 512, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), false},
      {"layer4.1.conv2", 2, 512, 2, 2, 512, 3, 3, conv_attrs(1, 1, 1, 1, 1, 1, 1), false},
      {"layer4.1.conv3", 2, 512, 2, 2, 2048, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), false},
      {"layer3.1.conv1", 2, 1024, 4, 4, 256, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), false},
      {"layer1.0.conv1", 2, 64, 16, 16, 64, 1, 1, conv_attrs(1, 1, 0, 0, 1, 1, 1), false},
      {"conv1", 2, 3, 64, 64, 64, 7, 7, conv_attrs(2, 2, 3, 3, 1, 1, 1), false},
  };
  for (const ConvCase& c : wide)
    for (MemoryFormat mf : {kNCHW, kNHWC}) {
      const std::string what = fmt::format("{} {}", c.name, mf == kNHWC ? "NHWC" : "NCHW");
      const Shape xs{c.N, c.C, c.H, c.W}, ws{c.Co, c.C / c.a.groups, c.KH, c.KW};
      Tensor x = rnd(xs, DType::F32, mf), w = rnd(ws, DType::F32);
      const MemoryFormat of = ops::conv2d_memory_format(x, w);
      Tensor gy = rnd(ops::conv2d_output_shape(xs, ws, c.a), DType::F32, of);
      int64_t n_ref = 0, n_dnn = 0;
      const ConvRun ref = run_on("im2col", x, w, Tensor(), gy, c.a, &n_ref);
      const ConvRun got = run_on("onednn", x, w, Tensor(), gy, c.a, &n_dnn);
      if (mf == kNHWC) {
        EXPECT_TRUE(ran_where_it_must(got, false)) << what;
      }
      // Reduction lengths: C kH kW terms per output, Co kH kW per input gradient, N oH oW per weight gradient.
      auto depth = [](int64_t terms) { return std::max(1.0, static_cast<double>(terms) / 300.0); };
      expect_close(got.y, ref.y, what + " forward", depth(c.C / c.a.groups * c.KH * c.KW));
      expect_close(got.gx, ref.gx, what + " grad_input", depth(c.Co / c.a.groups * c.KH * c.KW));
      expect_close(got.gw, ref.gw, what + " grad_weight", depth(gy.numel() / c.Co));
    }
}

TEST(OneDnnConv, F64FallsBackToIm2col) {
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  Tensor x = rnd({2, 4, 5, 5}, DType::F64, kNHWC), w = rnd({4, 4, 3, 3}, DType::F64);
  Tensor gy = rnd({2, 4, 5, 5}, DType::F64, kNHWC);
  int64_t n = -1;
  const ConvRun r = run_on("onednn", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(n, 0) << "oneDNN has no F64 convolution: the im2col path must run";
  int64_t m = -1;
  const ConvRun s = run_on("im2col", x, w, Tensor(), gy, a, &m);
  EXPECT_EQ(r.y.tolist<double>(), s.y.tolist<double>());
}

TEST(OneDnnConv, NestedCallRunsOnOneThread) {
  // A conv from inside a parallel_for (a pool worker, or the caller of a nested call) must not start an
  // OpenMP team of get_num_threads() threads there: it runs with one, and gives the same values.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  ScopedEnv env("AMPFORGE_CPU_CONV", "onednn");
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  Tensor x = rnd({2, 8, 6, 6}, DType::F32, kNHWC), w = rnd({8, 8, 3, 3}, DType::F32);
  const Tensor outside = ops::conv2d(x, w, Tensor(), a);
  std::vector<Tensor> inside(2);
  parallel_for(2, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) inside[i] = ops::conv2d(x, w, Tensor(), a);
  });
  for (const Tensor& t : inside) expect_close(t, outside, "nested conv2d");
}

TEST(OneDnnConv, WinogradWhereItPaysWithinTheF32Table) {
  // ResNet-50's layer1 3x3 at a smaller batch: 64 channels on 16x16 outputs fits the Winograd rule; where oneDNN
  // has Winograd kernels (onednn_conv_offer(): AVX-512 in oneDNN 2.6) each direction must run on them, elsewhere on
  // the direct kernels the rule falls back to (never on a Winograd name that is not there), and either way agree
  // with im2col's direct sums, in both activation layouts. 576 terms per output and input-gradient element,
  // 2 * 16 * 16 per weight-gradient element.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  const bool wino = cpu::onednn_conv_offer().winograd;
  auto on_rule_kernel = [&]() -> ::testing::AssertionResult {
    if (wino) return last_impl_has("wino");
    const std::string impl = cpu::onednn_last_impl();
    if (impl.find("wino") == std::string::npos) return ::testing::AssertionSuccess() << impl;
    return ::testing::AssertionFailure() << "'" << impl << "' names Winograd, which oneDNN does not offer here";
  };
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  for (MemoryFormat mf : {kNHWC, kNCHW}) {
    const std::string what = mf == kNHWC ? "NHWC" : "NCHW";
    Tensor x = rnd({2, 64, 16, 16}, DType::F32, mf), w = rnd({64, 64, 3, 3}, DType::F32);
    const MemoryFormat of = ops::conv2d_memory_format(x, w);
    Tensor gy = rnd({2, 64, 16, 16}, DType::F32, of);
    int64_t n = 0;
    const ConvRun ref = run_on("im2col", x, w, Tensor(), gy, a, &n);
    ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "auto");
    ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
    ConvRun got;
    got.y = ops::conv2d(x, w, Tensor(), a);
    EXPECT_TRUE(on_rule_kernel()) << what;
    got.gx = ops::conv2d_backward_input(gy, w, x.shape(), a, of);
    EXPECT_TRUE(on_rule_kernel()) << what;
    got.gw = ops::conv2d_backward_weight(gy, x, w.shape(), a);
    EXPECT_TRUE(on_rule_kernel()) << what;
    EXPECT_TRUE(got.y.is_contiguous(of)) << what;
    expect_close(got.y, ref.y, what + " forward", 576.0 / 300);
    expect_close(got.gx, ref.gx, what + " grad_input", 576.0 / 300);
    expect_close(got.gw, ref.gw, what + " grad_weight", 512.0 / 300);
    {
      ScopedEnv direct("AMPFORGE_CPU_CONV_ALGO", "direct");
      ops::conv2d(x, w, Tensor(), a);
      if (mf == kNHWC) {
        EXPECT_FALSE(last_impl_has("wino"));
      }
    }
  }
  // Below the rule's bounds (32 channels; 8x8 outputs) the direct kernels run.
  for (const Shape& xs : {Shape{2, 32, 16, 16}, Shape{2, 64, 8, 8}}) {
    ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
    Tensor x = rnd(xs, DType::F32, kNHWC), w = rnd({xs[1], xs[1], 3, 3}, DType::F32);
    ops::conv2d(x, w, Tensor(), a);
    EXPECT_FALSE(last_impl_has("wino")) << xs.str();
  }
}

TEST(OneDnnConv, BadAlgoEnvValueIsAnError) {
  ScopedEnv env("AMPFORGE_CPU_CONV_ALGO", "fft");
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN): the variable is not read";
  ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
  expect_conv_error(rnd({1, 2, 4, 4}, DType::F32, kNHWC), "AMPFORGE_CPU_CONV_ALGO=fft: expected auto, direct or benchmark");
}

TEST(OneDnnConv, TransientBuffersAreReusedAcrossCalls) {
  // The Winograd problem needs all four buffers (scratchpad, blocked weights, both blocked activations) where oneDNN
  // has Winograd kernels; elsewhere the direct kernels run it with blocked weights and their scratchpad. The first
  // round of calls may grow them; repeating the same calls must take no new memory.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "auto");
  ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  Tensor x = rnd({2, 64, 16, 16}, DType::F32, kNHWC), w = rnd({64, 64, 3, 3}, DType::F32);
  const MemoryFormat of = ops::conv2d_memory_format(x, w);
  Tensor gy = rnd({2, 64, 16, 16}, DType::F32, of);
  auto round = [&] {
    ops::conv2d(x, w, Tensor(), a);
    ops::conv2d_backward_input(gy, w, x.shape(), a, of);
    ops::conv2d_backward_weight(gy, x, w.shape(), a);
  };
  round();
  const int64_t grows = cpu::onednn_scratch_grows(), bytes = cpu::onednn_scratch_bytes();
  if (cpu::onednn_conv_offer().winograd) {
    ASSERT_TRUE(last_impl_has("wino"));
    // At least the two blocked activations (2 x 64 x 16 x 16 floats each) are held.
    EXPECT_GE(bytes, 2 * 2 * 64 * 16 * 16 * 4);
  } else {
    EXPECT_EQ(cpu::onednn_last_impl().rfind("declined", 0), std::string::npos) << cpu::onednn_last_impl();
    EXPECT_GT(bytes, 0) << "the direct kernels' blocked weights are held too";
  }
  for (int i = 0; i < 3; ++i) round();
  EXPECT_EQ(cpu::onednn_scratch_grows(), grows);
  EXPECT_EQ(cpu::onednn_scratch_bytes(), bytes);
}

TEST(OneDnnConv, BenchmarkModeMeasuresEachProblemOnceAndAgreesWithIm2col) {
  // A problem with all three candidates (direct, direct on nChw16c, Winograd): the first call of each direction
  // measures them, later calls reuse the choice; whichever won, results agree with im2col's direct sums.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  const Conv2dAttrs a = conv_attrs(1, 1, 1, 1, 1, 1, 1);
  Tensor x = rnd({2, 32, 12, 12}, DType::F32, kNHWC), w = rnd({48, 32, 3, 3}, DType::F32);
  const MemoryFormat of = ops::conv2d_memory_format(x, w);
  Tensor gy = rnd({2, 48, 12, 12}, DType::F32, of);
  int64_t n = 0;
  const ConvRun ref = run_on("im2col", x, w, Tensor(), gy, a, &n);
  ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "benchmark");
  // Any candidate may win, Winograd included, whose transforms (F(4x4, 3x3)) add and subtract scaled inputs before
  // the products: its rounding is a few times a direct sum's of the same length (the tolerance table's scale
  // counts terms), hence 3x the term count here.
  const double k = 3.0;
  const int64_t measured0 = cpu::onednn_benchmarked_problems();
  ConvRun got = run_on("onednn", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(n, 3) << "the measuring runs must not count as the call's result twice";
  EXPECT_EQ(cpu::onednn_benchmarked_problems() - measured0, 3) << "one measurement per direction";
  expect_close(got.y, ref.y, "forward", k * 288.0 / 300);
  expect_close(got.gx, ref.gx, "grad_input", k * 432.0 / 300);
  expect_close(got.gw, ref.gw, "grad_weight", k * 288.0 / 300);
  got = run_on("onednn", x, w, Tensor(), gy, a, &n);
  EXPECT_EQ(cpu::onednn_benchmarked_problems() - measured0, 3) << "second calls must reuse the choice";
  EXPECT_EQ(n, 3);
  expect_close(got.y, ref.y, "forward (again)", k * 288.0 / 300);
  // BF16 has the direct and the nChw16c candidates (the latter's activation copies move 2-byte elements).
  const ScopedEnv native("AMPFORGE_CPU_BF16", "native");
  Tensor xb = ops::to_dtype(x, DType::BF16), wb = ops::to_dtype(w, DType::BF16), gyb = ops::to_dtype(gy, DType::BF16);
  const ConvRun refb = run_on("im2col", xb, wb, Tensor(), gyb, a, &n);
  const ConvRun gotb = run_on("onednn", xb, wb, Tensor(), gyb, a, &n);
  EXPECT_TRUE(ran_where_it_must(gotb, true));
  EXPECT_EQ(n, cpu::onednn_conv_offer().bf16 ? 3 : 0);
  expect_close(gotb.y, refb.y, "BF16 forward");
  expect_close(gotb.gx, refb.gx, "BF16 grad_input");
  expect_close(gotb.gw, refb.gw, "BF16 grad_weight");
}

TEST(OneDnnConv, PointwiseGradientsRunAsMatrixProducts) {
  // 1x1 F32 convolutions on channels-last activations, stride 1 and stride 2 (odd sizes: the last row and column
  // are read at stride 1 only): both gradients are GEMMs on the tensors as they lie, for a row-major weight and for
  // a transposed view of one (the weight gradient then written through the view), with more output than input
  // channels and fewer (the weight gradient's product runs in whichever orientation has fewer rows, then is
  // transposed into place when that is not the weight's own: all four cases); both agree with im2col. The
  // forward stays a convolution primitive; AMPFORGE_CPU_CONV_ALGO=direct keeps the gradients on the convolution
  // primitives too.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  for (const auto& [C, Co] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}}) {
  Tensor x = rnd({3, C, 7, 5}, DType::F32, kNHWC);
  Tensor w_plain = rnd({Co, C, 1, 1}, DType::F32);
  Tensor w_t = rnd({C, Co, 1, 1}, DType::F32).transpose(0, 1);  // (Co, C, 1, 1), stride(0) == 1
  for (int64_t stride : {1, 2}) {
    const Conv2dAttrs a = conv_attrs(stride, stride, 0, 0, 1, 1, 1);
    const int64_t Ho = (7 - 1) / stride + 1, Wo = (5 - 1) / stride + 1;
    for (const Tensor& w : {w_plain, w_t}) {
      const std::string what = std::string(w.stride(1) == 1 ? "row-major weight" : "transposed weight") + ", stride " +
                               std::to_string(stride) + ", " + std::to_string(C) + " -> " + std::to_string(Co);
      const MemoryFormat of = ops::conv2d_memory_format(x, w);
      Tensor gy = rnd({3, Co, Ho, Wo}, DType::F32, of);
      int64_t n = 0;
      const ConvRun ref = run_on("im2col", x, w, Tensor(), gy, a, &n);
      ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "auto");
      ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
      ConvRun got;
      got.y = ops::conv2d(x, w, Tensor(), a);
      EXPECT_FALSE(last_impl_has("sgemm")) << what;
      // Garbage in the input gradient's buffer must not survive where the strided kernel reads nothing.
      Tensor gx = Tensor::empty(x.shape(), DType::F32, kCPU, kNHWC);
      ops::copy_(gx, rnd(x.shape(), DType::F32, kNHWC));
      ASSERT_TRUE(cpu::onednn_conv2d_backward_input(gy, w, gx, a)) << what;
      EXPECT_TRUE(last_impl_has("sgemm")) << what;
      got.gw = ops::conv2d_backward_weight(gy, x, w.shape(), a);
      EXPECT_TRUE(last_impl_has("sgemm")) << what;
      // The kernel entry point writes a weight gradient of the weight's own strides.
      Tensor gw_view = w.stride(1) == 1 ? Tensor::empty(w.shape(), DType::F32, kCPU)
                                        : Tensor::empty({C, Co, 1, 1}, DType::F32, kCPU).transpose(0, 1);
      ASSERT_TRUE(cpu::onednn_conv2d_backward_weight(gy, x, gw_view, a)) << what;
      expect_close(got.y, ref.y, what + " forward", 1);
      expect_close(gx, ref.gx, what + " grad_input", 1);
      expect_close(got.gw, ref.gw, what + " grad_weight", 105.0 / 300);
      expect_close(ops::contiguous(gw_view), ref.gw, what + " grad_weight through the view", 105.0 / 300);
      ScopedEnv direct("AMPFORGE_CPU_CONV_ALGO", "direct");
      ops::conv2d_backward_input(gy, w, x.shape(), a, of);
      EXPECT_FALSE(last_impl_has("sgemm"));
    }
  }
  }
}

TEST(OneDnnConv, Bf16PointwiseGradientsRunAsBf16MatrixProducts) {
  // 1x1 stride-1 BF16 convolutions on channels-last activations with oneDNN's BF16 kernels: where the BF16 matmul is
  // active (native BF16 on this CPU), both gradients are oneDNN BF16 matrix products, for more output than input
  // channels and fewer, and agree with im2col within the BF16 row (the weight gradient sums 3*7*5 terms); stride 2
  // and AMPFORGE_CPU_CONV_ALGO=direct stay on the convolution primitive. Where the matmul is not active, the
  // convolution primitive runs them.
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  const ScopedEnv native("AMPFORGE_CPU_BF16", "native");
  const bool matmul = cpu::onednn_bf16_matmul_active();
  for (const auto& [C, Co] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}})
    for (int64_t stride : {1, 2}) {
      const std::string what = fmt::format("{} -> {}, stride {}", C, Co, stride);
      const Conv2dAttrs a = conv_attrs(stride, stride, 0, 0, 1, 1, 1);
      Tensor x = rnd({3, C, 7, 5}, DType::BF16, kNHWC), w = rnd({Co, C, 1, 1}, DType::BF16);
      Tensor gy = rnd(ops::conv2d_output_shape(x.shape(), w.shape(), a), DType::BF16, kNHWC);
      int64_t n = 0;
      const ConvRun ref = run_on("im2col", x, w, Tensor(), gy, a, &n);
      const ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "auto");
      const ConvRun got = run_on("onednn", x, w, Tensor(), gy, a, &n);
      const bool as_matmul = matmul && stride == 1;
      EXPECT_EQ(got.impl[0].find("BF16 matmul"), std::string::npos) << what << ": " << got.impl[0];
      for (int d : {1, 2})
        EXPECT_EQ(got.impl[d].rfind("BF16 matmul", 0) == 0, as_matmul) << what << ": " << got.impl[d];
      expect_close(got.gx, ref.gx, what + " grad_input");
      expect_close(got.gw, ref.gw, what + " grad_weight");
      const ScopedEnv direct("AMPFORGE_CPU_CONV_ALGO", "direct");
      const ConvRun on_direct = run_on("onednn", x, w, Tensor(), gy, a, &n);
      for (int d : {1, 2}) EXPECT_EQ(on_direct.impl[d].find("BF16 matmul"), std::string::npos) << what;
    }
}

// A 16-bit convolution on the F32 way (F16 always, BF16 with AMPFORGE_CPU_BF16=f32) is the F32 convolution of its
// operands converted to F32, rounded once (the same primitive on the same shapes and layouts: the same bits), in all
// three directions, with a bias; and oneDNN's BF16 kernels agree with the F32 way within the BF16 row of the table.
TEST(OneDnnConv, SixteenBitAsF32CopiesIsTheF32ProblemRounded) {
  if (!cpu::onednn_built()) GTEST_SKIP() << "built without oneDNN (AMPFORGE_ONEDNN)";
  ScopedEnv path("AMPFORGE_CPU_CONV", "onednn");
  ScopedEnv algo("AMPFORGE_CPU_CONV_ALGO", "auto");
  auto f32 = [](const Tensor& t) { return ops::to_dtype(t, DType::F32); };
  // 3x3 with 64 channels on 16x16 takes the Winograd rule in F32; the strided and the 1x1 ones other kernels.
  const std::vector<std::pair<Shape, Conv2dAttrs>> problems{
      {{2, 64, 16, 16}, conv_attrs(1, 1, 1, 1, 1, 1, 1)},
      {{2, 32, 15, 15}, conv_attrs(2, 2, 1, 1, 1, 1, 1)},
      {{2, 48, 9, 9}, conv_attrs(1, 1, 0, 0, 1, 1, 1)}};
  for (DType dt : {DType::BF16, DType::F16})
    for (const auto& [xs, a] : problems) {
      const int64_t k = a.padding[0] == 0 ? 1 : 3;
      const Tensor x = rnd(xs, dt, kNHWC), w = rnd({64, xs[1], k, k}, dt), b = rnd({64}, dt);
      const Tensor gy = rnd(ops::conv2d_output_shape(xs, w.shape(), a), dt, kNHWC);
      const std::string what = fmt::format("{} x {} stride {}", dtype_name(dt), fmt::join(xs, "x"), a.stride[0]);
      auto rounded = [&](const Tensor& t) { return ops::to_dtype(t, dt).tolist<float>(); };
      int64_t n = 0;
      ConvRun as_f32;
      {
        ScopedEnv way("AMPFORGE_CPU_BF16", "f32");
        as_f32 = run_on("onednn", x, w, b, gy, a, &n);
      }
      EXPECT_TRUE(ran_where_it_must(as_f32, false)) << what << ": the F32 problem";
      int64_t n_want = 0;
      const ConvRun want = run_on("onednn", f32(x), f32(w), f32(b), f32(gy), a, &n_want);
      EXPECT_EQ(n, n_want) << what << ": the 16-bit problem on F32 copies must take the F32 problem's path";
      EXPECT_EQ(as_f32.y.dtype(), dt);
      EXPECT_TRUE(as_f32.y.is_contiguous(kNHWC)) << what;
      EXPECT_EQ(as_f32.y.tolist<float>(), rounded(want.y)) << what << " forward";
      EXPECT_EQ(as_f32.gx.tolist<float>(), rounded(want.gx)) << what << " grad_input";
      EXPECT_EQ(as_f32.gw.tolist<float>(), rounded(want.gw)) << what << " grad_weight";
      if (dt != DType::BF16) continue;
      ScopedEnv way("AMPFORGE_CPU_BF16", "native");
      const ConvRun native = run_on("onednn", x, w, b, gy, a, &n);
      EXPECT_TRUE(ran_where_it_must(native, true)) << what;
      // The table's scale: ~300-term sums.
      const double terms_y = static_cast<double>(xs[1] * k * k), terms_gx = 64.0 * k * k,
                   terms_gw = static_cast<double>(gy.numel() / 64);
      expect_close(native.y, as_f32.y, what + " forward, native against F32 copies", std::max(1.0, terms_y / 300));
      expect_close(native.gx, as_f32.gx, what + " grad_input, native against F32 copies", std::max(1.0, terms_gx / 300));
      expect_close(native.gw, as_f32.gw, what + " grad_weight, native against F32 copies", std::max(1.0, terms_gw / 300));
    }
}
