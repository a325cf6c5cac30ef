// CUDA fused attention (flash-style forward, deterministic backward) against the CPU kernels: outputs, lse and
// q/k/v gradients with and without masks (padding mask broadcast over heads and queries, a full per-head mask),
// causal with Tq > Tk and Tq < Tk, head dims 64 and 128 (and odd ones), long sequences (1000), F32/F16/BF16,
// fully masked rows, bit-identical backward run to run, the autograd path, and the composite fallback for
// head dims above 128. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ampforge/autograd/functions.h"
#include "ampforge/backends/cuda/gpu_testutil.h"
#include "ampforge/core/attrs.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

Tensor bool_mask(const Shape& s, uint64_t seed, double keep) {
  Generator gen(seed);
  return ops::compare(OpId::lt, ops::rand(s, DType::F32, kCPU, &gen), ops::full(Shape{}, keep));
}

struct AttnCase {
  int64_t B, H, Tq, Tk, D, Dv;
  int mask;  // 0: none, 1: padding (B, 1, 1, Tk), 2: full (B, H, Tq, Tk)
  bool causal;
};

std::string name(const AttnCase& s, DType dt) {
  return std::string(dtype_name(dt)) + " B" + std::to_string(s.B) + " H" + std::to_string(s.H) + " Tq" +
         std::to_string(s.Tq) + " Tk" + std::to_string(s.Tk) + " D" + std::to_string(s.D) + " Dv" +
         std::to_string(s.Dv) + " mask" + std::to_string(s.mask) + (s.causal ? " causal" : "");
}

void check(const AttnCase& s, DType dt, double factor) {
  const std::string what = name(s, dt);
  Tensor q = random_cpu({s.B, s.H, s.Tq, s.D}, dt, 300);
  Tensor k = random_cpu({s.B, s.H, s.Tk, s.D}, dt, 301);
  Tensor v = random_cpu({s.B, s.H, s.Tk, s.Dv}, dt, 302);
  Tensor g = random_cpu({s.B, s.H, s.Tq, s.Dv}, dt, 303);
  Tensor mask = s.mask == 1   ? bool_mask({s.B, 1, 1, s.Tk}, 304, 0.8)
                : s.mask == 2 ? bool_mask({s.B, s.H, s.Tq, s.Tk}, 305, 0.7)
                              : Tensor();
  AttentionAttrs at;
  at.causal = s.causal;
  const ops::AttentionResult c = ops::attention(q, k, v, mask, at);
  Tensor mc = mask.defined() ? to_cuda(mask) : Tensor();
  const ops::AttentionResult r = ops::attention(to_cuda(q), to_cuda(k), to_cuda(v), mc, at);
  expect_matches_cpu(r.out, c.out, what + " out", factor);
  expect_matches_cpu(r.lse, c.lse, what + " lse", factor);
  const ops::AttentionGrads cg = ops::attention_backward(g, q, k, v, c.out, c.lse, mask, at);
  const ops::AttentionGrads rg =
      ops::attention_backward(to_cuda(g), to_cuda(q), to_cuda(k), to_cuda(v), r.out, r.lse, mc, at);
  expect_matches_cpu(rg.dq, cg.dq, what + " dq", factor);
  expect_matches_cpu(rg.dk, cg.dk, what + " dk", factor);
  expect_matches_cpu(rg.dv, cg.dv, what + " dv", factor);
}

}  // namespace

TEST(CudaAttention, OddSizesMasksCausal) {
  AF_SKIP_WITHOUT_CUDA();
  const AttnCase cases[] = {
      {2, 3, 37, 45, 20, 13, 0, false}, {2, 2, 50, 33, 16, 24, 0, true}, {1, 3, 19, 70, 8, 5, 1, true},
      {2, 3, 21, 40, 12, 12, 1, false}, {2, 2, 33, 65, 9, 7, 2, true},  {1, 1, 1, 1, 1, 1, 0, false},
      {3, 1, 64, 64, 32, 32, 2, false},
  };
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const AttnCase& s : cases) check(s, dt, 2.0);
}

TEST(CudaAttention, HeadDims64And128LongSequences) {
  AF_SKIP_WITHOUT_CUDA();
  const AttnCase cases[] = {
      {2, 2, 1000, 1000, 64, 64, 0, true},   {1, 2, 1000, 1000, 128, 128, 1, false},
      {1, 2, 1000, 777, 128, 64, 2, true},   {2, 1, 300, 1000, 64, 128, 1, true},
  };
  for (DType dt : {DType::F32, DType::BF16})
    for (const AttnCase& s : cases) check(s, dt, 4.0);  // 1000-term sums in different orders
  check({1, 2, 513, 1000, 128, 128, 1, true}, DType::F16, 4.0);
}

TEST(CudaAttention, FullyMaskedRowsMatchTheCpu) {
  AF_SKIP_WITHOUT_CUDA();
  const int64_t Tq = 40, Tk = 70;
  std::vector<float> keep(static_cast<size_t>(Tq * Tk), 1.0f);
  for (int64_t j = 0; j < Tk; ++j) keep[static_cast<size_t>(3 * Tk + j)] = 0.0f;  // row 3 attends nothing
  keep[static_cast<size_t>(35 * Tk + 0)] = 0.0f;
  Tensor mask = ops::compare(OpId::gt, Tensor::from_vector<float>(keep, Shape{1, 1, Tq, Tk}), ops::full(Shape{}, 0.5));
  Tensor q = random_cpu({1, 2, Tq, 16}, DType::F32, 310), k = random_cpu({1, 2, Tk, 16}, DType::F32, 311);
  Tensor v = random_cpu({1, 2, Tk, 8}, DType::F32, 312), g = random_cpu({1, 2, Tq, 8}, DType::F32, 313);
  for (bool causal : {false, true}) {
    AttentionAttrs at;
    at.causal = causal;
    const ops::AttentionResult c = ops::attention(q, k, v, mask, at);
    const ops::AttentionResult r = ops::attention(to_cuda(q), to_cuda(k), to_cuda(v), to_cuda(mask), at);
    const ops::AttentionGrads cg = ops::attention_backward(g, q, k, v, c.out, c.lse, mask, at);
    const ops::AttentionGrads rg = ops::attention_backward(to_cuda(g), to_cuda(q), to_cuda(k), to_cuda(v), r.out,
                                                           r.lse, to_cuda(mask), at);
    // NaN where the CPU has NaN (the tolerance rule compares NaN as equal only to NaN).
    const std::vector<double> o = ops::to_dtype(to_cpu(r.out), DType::F64).tolist<double>();
    EXPECT_TRUE(std::isnan(o[3 * 8])) << "row 3 attends nothing";
    expect_matches_cpu(r.out, c.out, "out", 2.0);
    expect_matches_cpu(rg.dq, cg.dq, "dq", 2.0);
    expect_matches_cpu(rg.dk, cg.dk, "dk", 2.0);
    expect_matches_cpu(rg.dv, cg.dv, "dv", 2.0);
  }
}

TEST(CudaAttention, BackwardIsBitIdenticalRunToRun) {
  AF_SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor q = to_cuda(random_cpu({2, 4, 1000, 64}, dt, 320)), k = to_cuda(random_cpu({2, 4, 1000, 64}, dt, 321));
    Tensor v = to_cuda(random_cpu({2, 4, 1000, 64}, dt, 322)), g = to_cuda(random_cpu({2, 4, 1000, 64}, dt, 323));
    Tensor mask = to_cuda(bool_mask({2, 1, 1, 1000}, 324, 0.9));
    AttentionAttrs at;
    at.causal = true;
    const ops::AttentionResult r1 = ops::attention(q, k, v, mask, at), r2 = ops::attention(q, k, v, mask, at);
    expect_identical(r1.out, to_cpu(r2.out), "out");
    const ops::AttentionGrads a = ops::attention_backward(g, q, k, v, r1.out, r1.lse, mask, at);
    const ops::AttentionGrads b = ops::attention_backward(g, q, k, v, r1.out, r1.lse, mask, at);
    expect_identical(a.dq, to_cpu(b.dq), "dq");
    expect_identical(a.dk, to_cpu(b.dk), "dk");
    expect_identical(a.dv, to_cpu(b.dv), "dv");
  }
}

TEST(CudaAttention, AutogradPathAndLargeHeadFallback) {
  AF_SKIP_WITHOUT_CUDA();
  for (int64_t D : {64, 160}) {  // 160 > 128: the composite on CUDA, the fused op on the CPU
    Tensor q = random_cpu({2, 2, 45, D}, DType::F32, 330), k = random_cpu({2, 2, 51, D}, DType::F32, 331);
    Tensor v = random_cpu({2, 2, 51, 24}, DType::F32, 332), g = random_cpu({2, 2, 45, 24}, DType::F32, 333);
    Tensor mask = bool_mask({2, 1, 1, 51}, 334, 0.8);
    auto run = [&](Device dev) {
      Tensor ql = ops::to_device(q, dev), kl = ops::to_device(k, dev), vl = ops::to_device(v, dev);
      ql.requires_grad_();
      kl.requires_grad_();
      vl.requires_grad_();
      Tensor out = scaled_dot_product_attention(ql, kl, vl, ops::to_device(mask, dev), true, 0);
      sum(mul(out, ops::to_device(g, dev))).backward();
      return std::vector<Tensor>{out, ql.grad(), kl.grad(), vl.grad()};
    };
    const std::vector<Tensor> c = run(kCPU), r = run(kCuda0);
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) expect_matches_cpu(r[i], c[i], std::string(names[i]) + " D=" + std::to_string(D), 4.0);
  }
}
