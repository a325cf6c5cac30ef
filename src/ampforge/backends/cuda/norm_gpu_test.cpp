// CUDA batch_norm and layer_norm (forward and backward) against the CPU kernels: F32/F16/BF16 inputs,
// F32 and 16-bit parameters, contiguous and channels-last batch-norm inputs, 2-D/3-D/4-D inputs, shapes
// large enough to split each channel's reduction, training with running-stat updates, eval mode, missing
// weight/bias/running stats, an empty batch in eval mode, layer-norm rows for the warp and the block
// kernels, several normalised dims, and bit-identical backward results from run to run; and the fused ends of
// ResNet's and YOLOv8's blocks (batch_norm_act, batch_norm_add_act) through autograd, one kernel on the CPU and the
// ops they compose on CUDA. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

Tensor maybe_cuda(const Tensor& t, bool cuda) { return t.defined() && cuda ? to_cuda(t) : t; }

struct BnCase {
  Shape shape;
  bool channels_last = false;
};

std::string bn_name(const BnCase& c, DType dt, DType pdt, bool training) {
  return "batch_norm " + c.shape.str() + (c.channels_last ? " channels-last " : " ") + std::string(dtype_name(dt)) +
         " params " + std::string(dtype_name(pdt)) + (training ? " train" : " eval");
}

const std::vector<BnCase> kBnCases = {
    {Shape{4, 5, 7, 3}, false},      // planes
    {Shape{4, 5, 7, 3}, true},       // rows of 5 channels
    {Shape{37, 70}, false},          // (N, C): rows, C not a multiple of 32
    {Shape{3, 4, 50}, false},        // (N, C, L)
    {Shape{2, 3, 130, 130}, false},  // 33800 elements per channel: several splits
    {Shape{4, 40, 20, 20}, true},    // 1600 rows: several row splits
    {Shape{3, 6, 1, 1}, true},       // one spatial element
};

// Runs batch_norm forward and backward on one device; running stats are fresh copies of rm0/rv0.
struct BnRun {
  ops::BatchNormResult fwd;
  Tensor rm, rv;
  ops::NormGrads grads;
};

BnRun run_bn(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm0, const Tensor& rv0, const Tensor& go,
             const BatchNormAttrs& at, bool cuda) {
  BnRun r;
  r.rm = rm0.defined() ? maybe_cuda(ops::clone(rm0), cuda) : Tensor();
  r.rv = rv0.defined() ? maybe_cuda(ops::clone(rv0), cuda) : Tensor();
  const Tensor xd = maybe_cuda(x, cuda), wd = maybe_cuda(w, cuda), bd = maybe_cuda(b, cuda);
  r.fwd = ops::batch_norm(xd, wd, bd, r.rm, r.rv, at);
  r.grads = ops::batch_norm_backward(maybe_cuda(go, cuda), xd, wd, r.fwd.save_mean, r.fwd.save_invstd, at,
                                     {true, w.defined(), b.defined()});
  return r;
}

void compare_bn(const BnRun& g, const BnRun& c, const std::string& what) {
  expect_matches_cpu(g.fwd.out, c.fwd.out, what + " out");
  EXPECT_EQ(g.fwd.out.is_contiguous(MemoryFormat::ChannelsLast) && !g.fwd.out.is_contiguous(),
            c.fwd.out.is_contiguous(MemoryFormat::ChannelsLast) && !c.fwd.out.is_contiguous())
      << what << ": layout";
  expect_matches_cpu(g.fwd.save_mean, c.fwd.save_mean, what + " save_mean");
  expect_matches_cpu(g.fwd.save_invstd, c.fwd.save_invstd, what + " save_invstd");
  if (c.rm.defined()) {
    expect_matches_cpu(g.rm, c.rm, what + " running_mean");
    expect_matches_cpu(g.rv, c.rv, what + " running_var");
  }
  expect_matches_cpu(g.grads.grad_input, c.grads.grad_input, what + " grad_input");
  if (c.grads.grad_weight.defined()) expect_matches_cpu(g.grads.grad_weight, c.grads.grad_weight, what + " grad_weight");
  if (c.grads.grad_bias.defined()) expect_matches_cpu(g.grads.grad_bias, c.grads.grad_bias, what + " grad_bias");
}

Tensor bn_input(const BnCase& c, DType dt, uint64_t seed) {
  Tensor x = random_cpu(c.shape, dt, seed, 2.0, 0.5);
  return c.channels_last ? ops::contiguous(x, MemoryFormat::ChannelsLast) : x;
}

}  // namespace

TEST(CudaBatchNorm, TrainingAndEvalMatchCpu) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (DType pdt : dt == DType::F32 ? std::vector<DType>{DType::F32} : std::vector<DType>{DType::F32, dt})
      for (const BnCase& c : kBnCases)
        for (bool training : {true, false}) {
          const int64_t C = c.shape[1];
          Tensor x = bn_input(c, dt, 400);
          Tensor w = random_cpu(Shape{C}, pdt, 401, 0.5, 1.0);
          Tensor b = random_cpu(Shape{C}, pdt, 402);
          Tensor rm = random_cpu(Shape{C}, pdt, 403, 0.3);
          Tensor rv = ops::add_scalar(ops::to_dtype(absolute(random_cpu(Shape{C}, DType::F32, 404)), pdt), 0.5);
          Tensor go = bn_input(c, dt, 405);
          BatchNormAttrs at;
          at.training = training;
          at.momentum = 0.2;
          at.eps = 1e-3;
          const std::string what = bn_name(c, dt, pdt, training);
          compare_bn(run_bn(x, w, b, rm, rv, go, at, true), run_bn(x, w, b, rm, rv, go, at, false), what);
        }
}

TEST(CudaBatchNorm, FusedBlockEndsMatchCpu) {
  // act(bn(x)) for ReLU and SiLU, and act(bn(x) + residual) for ReLU and None, in training mode through autograd:
  // the CPU runs each as one kernel each way (the backward recomputing bn(x), or reading the ReLU mask from the
  // output), CUDA as batch_norm, add and the activation. Output, the gradients of x, the residual, weight and bias,
  // and the running statistics agree within the F32 table; a channels-last residual block as ResNet runs it.
  AF_SKIP_WITHOUT_CUDA();
  const Shape s{4, 32, 9, 7};
  const int64_t C = s[1];
  struct Case {
    NormAct act;
    bool residual;
  };
  for (const Case c : {Case{NormAct::ReLU, false}, Case{NormAct::SiLU, false}, Case{NormAct::ReLU, true},
                       Case{NormAct::None, true}}) {
    const std::string what = std::string(c.residual ? "batch_norm_add_act " : "batch_norm_act ") +
                             (c.act == NormAct::ReLU ? "relu" : c.act == NormAct::SiLU ? "silu" : "none");
    const Tensor x = ops::contiguous(random_cpu(s, DType::F32, 420, 2.0, 0.5), MemoryFormat::ChannelsLast);
    const Tensor r = ops::contiguous(random_cpu(s, DType::F32, 421), MemoryFormat::ChannelsLast);
    const Tensor w = random_cpu(Shape{C}, DType::F32, 422, 0.5, 1.0), b = random_cpu(Shape{C}, DType::F32, 423);
    const Tensor go = ops::contiguous(random_cpu(s, DType::F32, 424), MemoryFormat::ChannelsLast);
    auto run = [&](Device dev) {
      Tensor xl = ops::to_device(x, dev), rl = ops::to_device(r, dev), wl = ops::to_device(w, dev),
             bl = ops::to_device(b, dev);
      for (Tensor* t : {&xl, &rl, &wl, &bl}) t->requires_grad_();
      Tensor rm = ops::to_device(ops::zeros({C}, DType::F32, kCPU), dev);
      Tensor rv = ops::to_device(ops::ones({C}, DType::F32, kCPU), dev);
      const Tensor y = c.residual ? batch_norm_add_act(xl, rl, wl, bl, rm, rv, true, 0.1, 1e-5, c.act)
                                  : batch_norm_act(xl, wl, bl, rm, rv, true, 0.1, 1e-5, c.act);
      std::vector<Tensor> inputs{xl, wl, bl};
      if (c.residual) inputs.push_back(rl);
      std::vector<Tensor> out = autograd::grad({y}, inputs, {ops::to_device(go, dev)});
      out.insert(out.begin(), {y, rm, rv});
      return out;
    };
    const std::vector<Tensor> cpu = run(kCPU), gpu = run(kCuda0);
    const char* names[] = {"out", "running_mean", "running_var", "grad_input", "grad_weight", "grad_bias",
                           "grad_residual"};
    ASSERT_EQ(cpu.size(), gpu.size()) << what;
    for (size_t i = 0; i < cpu.size(); ++i) expect_matches_cpu(gpu[i], cpu[i], what + " " + names[i]);
  }
}

TEST(CudaBatchNorm, WithoutAffineOrRunningStats) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::BF16})
    for (const BnCase& c : {kBnCases[0], kBnCases[1], kBnCases[2]}) {
      Tensor x = bn_input(c, dt, 410);
      Tensor go = bn_input(c, dt, 411);
      BatchNormAttrs at;  // training
      compare_bn(run_bn(x, Tensor(), Tensor(), Tensor(), Tensor(), go, at, true),
                 run_bn(x, Tensor(), Tensor(), Tensor(), Tensor(), go, at, false),
                 bn_name(c, dt, DType::F32, true) + " no weight/bias/running stats");
      // bias only: grad_bias in the statistics' dtype
      Tensor b = random_cpu(Shape{c.shape[1]}, DType::F32, 412);
      compare_bn(run_bn(x, Tensor(), b, Tensor(), Tensor(), go, at, true),
                 run_bn(x, Tensor(), b, Tensor(), Tensor(), go, at, false), bn_name(c, dt, DType::F32, true) + " bias only");
    }
}

TEST(CudaBatchNorm, EvalWithEmptyBatch) {
  AF_SKIP_WITHOUT_CUDA();
  for (bool cl : {false, true}) {
    const BnCase c{Shape{0, 3, 4, 4}, cl};
    Tensor x = bn_input(c, DType::F32, 420);
    Tensor w = random_cpu(Shape{3}, DType::F32, 421), b = random_cpu(Shape{3}, DType::F32, 422);
    Tensor rm = random_cpu(Shape{3}, DType::F32, 423), rv = ops::full(Shape{3}, 2.0);
    BatchNormAttrs at;
    at.training = false;
    const BnRun g = run_bn(x, w, b, rm, rv, x, at, true), cpu = run_bn(x, w, b, rm, rv, x, at, false);
    EXPECT_EQ(g.fwd.out.shape(), x.shape());
    expect_matches_cpu(g.fwd.save_mean, cpu.fwd.save_mean, "empty batch save_mean");
    expect_matches_cpu(g.fwd.save_invstd, cpu.fwd.save_invstd, "empty batch save_invstd");
    expect_matches_cpu(g.grads.grad_weight, cpu.grads.grad_weight, "empty batch grad_weight (zeros)");
    expect_matches_cpu(g.grads.grad_bias, cpu.grads.grad_bias, "empty batch grad_bias (zeros)");
  }
}

TEST(CudaBatchNorm, BackwardIsBitIdenticalRunToRun) {
  AF_SKIP_WITHOUT_CUDA();
  for (const BnCase& c : {kBnCases[4], kBnCases[5]}) {
    Tensor x = to_cuda(bn_input(c, DType::F32, 430));
    Tensor go = to_cuda(bn_input(c, DType::F32, 431));
    Tensor w = to_cuda(random_cpu(Shape{c.shape[1]}, DType::F32, 432));
    BatchNormAttrs at;
    auto f1 = ops::batch_norm(x, w, Tensor(), Tensor(), Tensor(), at);
    auto f2 = ops::batch_norm(x, w, Tensor(), Tensor(), Tensor(), at);
    expect_identical(f1.out, to_cpu(f2.out), "batch_norm twice");
    auto g1 = ops::batch_norm_backward(go, x, w, f1.save_mean, f1.save_invstd, at, {true, true, true});
    auto g2 = ops::batch_norm_backward(go, x, w, f1.save_mean, f1.save_invstd, at, {true, true, true});
    expect_identical(g1.grad_input, to_cpu(g2.grad_input), "batch_norm_backward grad_input twice");
    expect_identical(g1.grad_weight, to_cpu(g2.grad_weight), "batch_norm_backward grad_weight twice");
    expect_identical(g1.grad_bias, to_cpu(g2.grad_bias), "batch_norm_backward grad_bias twice");
  }
}

namespace {

struct LnCase {
  Shape shape;
  Shape normalized;
};

const std::vector<LnCase> kLnCases = {
    {Shape{7, 1}, Shape{1}},          {Shape{7, 5}, Shape{5}},          {Shape{300, 31}, Shape{31}},
    {Shape{3, 4, 64}, Shape{64}},     {Shape{5, 1000}, Shape{1000}},    {Shape{4, 1025}, Shape{1025}},
    {Shape{3, 3000}, Shape{3000}},    {Shape{3, 4, 5, 6}, Shape{5, 6}}, {Shape{2, 3, 40, 40}, Shape{40, 40}},
};

struct LnRun {
  ops::LayerNormResult fwd;
  ops::NormGrads grads;
};

LnRun run_ln(const LnCase& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& go, bool cuda) {
  LnRun r;
  const Tensor xd = maybe_cuda(x, cuda), wd = maybe_cuda(w, cuda), bd = maybe_cuda(b, cuda);
  r.fwd = ops::layer_norm(xd, c.normalized, wd, bd, 1e-5);
  r.grads = ops::layer_norm_backward(maybe_cuda(go, cuda), xd, r.fwd.mean, r.fwd.rstd, wd, c.normalized.size(),
                                     {true, w.defined(), true});
  return r;
}

}  // namespace

TEST(CudaLayerNorm, ForwardAndBackwardMatchCpu) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const LnCase& c : kLnCases)
      for (bool affine : {true, false}) {
        const std::string what = "layer_norm " + c.shape.str() + " over " + c.normalized.str() + " " +
                                 std::string(dtype_name(dt)) + (affine ? " affine" : " no affine");
        Tensor x = random_cpu(c.shape, dt, 440, 1.5, 0.3);
        Tensor w = affine ? random_cpu(c.normalized, dt, 441, 0.5, 1.0) : Tensor();
        Tensor b = affine ? random_cpu(c.normalized, dt, 442) : Tensor();
        Tensor go = random_cpu(c.shape, dt, 443);
        const LnRun g = run_ln(c, x, w, b, go, true), cpu = run_ln(c, x, w, b, go, false);
        expect_matches_cpu(g.fwd.out, cpu.fwd.out, what + " out");
        expect_matches_cpu(g.fwd.mean, cpu.fwd.mean, what + " mean");
        expect_matches_cpu(g.fwd.rstd, cpu.fwd.rstd, what + " rstd");
        expect_matches_cpu(g.grads.grad_input, cpu.grads.grad_input, what + " grad_input");
        if (affine) expect_matches_cpu(g.grads.grad_weight, cpu.grads.grad_weight, what + " grad_weight");
        expect_matches_cpu(g.grads.grad_bias, cpu.grads.grad_bias, what + " grad_bias");
      }
}

TEST(CudaLayerNorm, F32InputWith16BitWeight) {
  AF_SKIP_WITHOUT_CUDA();
  const LnCase c{Shape{9, 48}, Shape{48}};
  Tensor x = random_cpu(c.shape, DType::F32, 450);
  Tensor w = random_cpu(c.normalized, DType::BF16, 451, 0.5, 1.0);
  Tensor b = random_cpu(c.normalized, DType::BF16, 452);
  Tensor go = random_cpu(c.shape, DType::F32, 453);
  const LnRun g = run_ln(c, x, w, b, go, true), cpu = run_ln(c, x, w, b, go, false);
  expect_matches_cpu(g.fwd.out, cpu.fwd.out, "layer_norm F32 x, BF16 weight: out");
  expect_matches_cpu(g.grads.grad_input, cpu.grads.grad_input, "layer_norm F32 x, BF16 weight: grad_input");
  expect_matches_cpu(g.grads.grad_weight, cpu.grads.grad_weight, "layer_norm F32 x, BF16 weight: grad_weight");
  expect_matches_cpu(g.grads.grad_bias, cpu.grads.grad_bias, "layer_norm F32 x, BF16 weight: grad_bias");
}

TEST(CudaLayerNorm, EmptyInputGivesZeroParameterGradients) {
  AF_SKIP_WITHOUT_CUDA();
  const LnCase c{Shape{0, 8}, Shape{8}};
  Tensor x = random_cpu(c.shape, DType::F32, 460);
  Tensor w = random_cpu(c.normalized, DType::F32, 461);
  Tensor b = random_cpu(c.normalized, DType::F32, 462);
  const LnRun g = run_ln(c, x, w, b, x, true), cpu = run_ln(c, x, w, b, x, false);
  EXPECT_EQ(g.fwd.out.shape(), x.shape());
  EXPECT_EQ(g.grads.grad_input.shape(), x.shape());
  expect_matches_cpu(g.grads.grad_weight, cpu.grads.grad_weight, "empty layer_norm grad_weight");
  expect_matches_cpu(g.grads.grad_bias, cpu.grads.grad_bias, "empty layer_norm grad_bias");
}

TEST(CudaLayerNorm, BackwardIsBitIdenticalRunToRun) {
  AF_SKIP_WITHOUT_CUDA();
  for (const LnCase& c : {LnCase{Shape{1000, 96}, Shape{96}}, LnCase{Shape{37, 2500}, Shape{2500}}}) {
    Tensor x = to_cuda(random_cpu(c.shape, DType::F32, 470));
    Tensor w = to_cuda(random_cpu(c.normalized, DType::F32, 471));
    Tensor go = to_cuda(random_cpu(c.shape, DType::F32, 472));
    auto f = ops::layer_norm(x, c.normalized, w, Tensor(), 1e-5);
    auto g1 = ops::layer_norm_backward(go, x, f.mean, f.rstd, w, 1, {true, true, true});
    auto g2 = ops::layer_norm_backward(go, x, f.mean, f.rstd, w, 1, {true, true, true});
    expect_identical(g1.grad_input, to_cpu(g2.grad_input), "layer_norm_backward grad_input twice");
    expect_identical(g1.grad_weight, to_cpu(g2.grad_weight), "layer_norm_backward grad_weight twice");
    expect_identical(g1.grad_bias, to_cpu(g2.grad_bias), "layer_norm_backward grad_bias twice");
  }
}
