// CUDA fused optimizer steps and GradScaler kernels against the CPU kernels: AdamW and SGD (momentum,
// Nesterov, weight decay) with F32/F16/BF16 gradients, 16-bit model copies (nearest and stochastic BF16
// rounding, bit-identical to the CPU), the device-side skip on found_inf, amp_unscale and
// amp_update_scale, a found_inf on another device refused. Skips without a CUDA device.
#include <gtest/gtest.h>

#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

struct Buffers {
  Tensor p, g, m1, m2, model, found;
};

Buffers make(int64_t n, DType grad_dtype, DType model_dtype, float found, Device dev) {
  Buffers b;
  b.p = random_cpu(Shape{n}, DType::F32, 400);
  b.g = random_cpu(Shape{n}, grad_dtype, 401, 0.1);
  b.m1 = random_cpu(Shape{n}, DType::F32, 402, 0.01);
  b.m2 = absolute(random_cpu(Shape{n}, DType::F32, 403, 0.001));
  if (model_dtype != DType::F32) b.model = ops::zeros(Shape{n}, model_dtype);
  b.found = ops::full(Shape{1}, found);
  if (dev.is_cuda())
    for (Tensor* t : {&b.p, &b.g, &b.m1, &b.m2, &b.model, &b.found})
      if (t->defined()) *t = to_cuda(*t);
  return b;
}

void compare(const Buffers& g, const Buffers& c, const std::string& what) {
  expect_matches_cpu(g.p, c.p, what + " param");
  expect_matches_cpu(g.m1, c.m1, what + " state 1");
  expect_matches_cpu(g.m2, c.m2, what + " state 2");
  if (c.model.defined()) expect_matches_cpu(g.model, c.model, what + " model copy");
}

}  // namespace

TEST(CudaOptim, AdamWMatchesCpu) {
  AF_SKIP_WITHOUT_CUDA();
  AdamWAttrs at;
  at.lr = 1e-2;
  at.weight_decay = 0.05;
  at.step = 7;
  for (DType gd : {DType::F32, DType::F16, DType::BF16})
    for (DType md : {DType::F32, DType::F16, DType::BF16})
      for (float found : {0.0f, 1.0f}) {
        Buffers c = make(10007, gd, md, found, kCPU), g = make(10007, gd, md, found, kCuda0);
        ops::adamw_step_(c.p, c.g, c.m1, c.m2, at, c.found, c.model);
        ops::adamw_step_(g.p, g.g, g.m1, g.m2, at, g.found, g.model);
        const std::string what = std::string("adamw grad ") + std::string(dtype_name(gd)) + " model " +
                                 std::string(dtype_name(md)) + (found != 0 ? " (skipped)" : "");
        compare(g, c, what);
        if (found != 0) expect_identical(g.p, make(10007, gd, md, 0, kCPU).p, what + ": untouched");
      }
}

TEST(CudaOptim, StochasticBf16ModelCopyIsBitIdentical) {
  AF_SKIP_WITHOUT_CUDA();
  AdamWAttrs at;
  at.rounding.stochastic = true;
  at.rounding.seed = 77;
  at.rounding.offset = 5;
  Buffers c = make(4099, DType::BF16, DType::BF16, 0, kCPU), g = make(4099, DType::BF16, DType::BF16, 0, kCuda0);
  ops::adamw_step_(c.p, c.g, c.m1, c.m2, at, c.found, c.model);
  ops::adamw_step_(g.p, g.g, g.m1, g.m2, at, g.found, g.model);
  // The masters may differ by an F32 rounding (FMA contraction); the stochastic rounding of equal masters
  // is identical. Compare where the masters agree bit for bit.
  const std::vector<float> pc = c.p.tolist<float>(), pg = to_cpu(g.p).tolist<float>();
  const std::vector<float> mc = ops::to_dtype(c.model, DType::F32).tolist<float>();
  const std::vector<float> mg = ops::to_dtype(to_cpu(g.model), DType::F32).tolist<float>();
  int64_t same_master = 0, mismatches = 0;
  for (size_t i = 0; i < pc.size(); ++i) {
    if (pc[i] != pg[i]) continue;
    ++same_master;
    if (mc[i] != mg[i]) ++mismatches;
  }
  EXPECT_GT(same_master, static_cast<int64_t>(pc.size()) / 2);
  EXPECT_EQ(mismatches, 0);
}

TEST(CudaOptim, SgdVariantsMatchCpu) {
  AF_SKIP_WITHOUT_CUDA();
  for (bool momentum : {false, true})
    for (bool nesterov : {false, true})
      for (bool first : {false, true}) {
        if (!momentum && (nesterov || first)) continue;
        SgdAttrs at;
        at.lr = 0.05;
        at.weight_decay = 1e-3;
        at.momentum = momentum ? 0.9 : 0.0;
        at.dampening = nesterov ? 0.0 : 0.1;
        at.nesterov = nesterov;
        at.first_step = first;
        for (DType gd : {DType::F32, DType::F16}) {
          Buffers c = make(3001, gd, DType::F16, 0, kCPU), g = make(3001, gd, DType::F16, 0, kCuda0);
          ops::sgd_step_(c.p, c.g, momentum ? c.m1 : Tensor(), at, c.found, c.model);
          ops::sgd_step_(g.p, g.g, momentum ? g.m1 : Tensor(), at, g.found, g.model);
          compare(g, c, "sgd");
        }
      }
}

TEST(CudaAmp, UnscaleAndUpdateScaleStayOnTheDevice) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (bool poison : {false, true}) {
      Tensor gc = random_cpu(Shape{5003}, dt, 410, 100.0);
      if (poison) ops::fill_(ops::slice(gc, 0, 4000, 4001, 1), INFINITY);
      Tensor gg = to_cuda(gc);
      Tensor inv_c = ops::full(Shape{1}, 1.0 / 1024), inv_g = to_cuda(inv_c);
      Tensor fc = ops::zeros(Shape{1}), fg = to_cuda(fc);
      ops::amp_unscale_(gc, inv_c, fc);
      ops::amp_unscale_(gg, inv_g, fg);
      expect_identical(gg, gc, "unscaled grads");
      expect_identical(fg, fc, "found_inf");
      // the scale update reads found_inf on the device
      for (int64_t interval : {1, 3}) {
        AmpUpdateAttrs at;
        at.growth_interval = interval;
        Tensor sc = ops::full(Shape{1}, 65536.0), tc = ops::full(Shape{1}, 2, DType::I32);
        Tensor sg = to_cuda(sc), tg = to_cuda(tc);
        ops::amp_update_scale_(sc, tc, fc, at);
        ops::amp_update_scale_(sg, tg, fg, at);
        expect_identical(sg, sc, "scale");
        expect_identical(tg, tc, "growth tracker");
      }
    }
}

// GradScaler's flag on the wrong device is an InvalidArgument error at the call, not a kernel reading a host
// pointer (which would end the CUDA context, failing every later test of the process).
TEST(CudaOptim, FoundInfOnAnotherDeviceIsRefused) {
  AF_SKIP_WITHOUT_CUDA();
  Buffers g = make(64, DType::F32, DType::F32, 0.0f, kCuda0);
  const Tensor host_flag = ops::zeros(Shape{1});
  AdamWAttrs aw;
  EXPECT_THROW(ops::adamw_step_(g.p, g.g, g.m1, g.m2, aw, host_flag, g.model), Error);
  SgdAttrs sg;
  EXPECT_THROW(ops::sgd_step_(g.p, g.g, g.m1, sg, host_flag, g.model), Error);
  AmpUpdateAttrs au;
  EXPECT_THROW(ops::amp_update_scale_(to_cuda(ops::full(Shape{1}, 65536.0)),
                                      to_cuda(ops::zeros(Shape{1}, DType::I32)), host_flag, au),
               Error);
  // The calls that were refused changed nothing; the device still works.
  EXPECT_NO_THROW(ops::adamw_step_(g.p, g.g, g.m1, g.m2, aw, g.found, g.model));
  expect_identical(ops::to_device(g.found, kCPU), host_flag, "found_inf");
}
