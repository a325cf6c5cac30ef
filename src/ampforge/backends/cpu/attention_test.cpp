// Fused attention on the CPU against the composite scaled_dot_product_attention (matmul, where, softmax):
// outputs and q/k/v gradients on odd sizes (Tq != Tk, D != Dv, lengths that are not multiples of 32), causal
// with Tq > Tk and Tq < Tk, masks broadcast over heads / queries / batches (the strided mask view and the
// materialised one), fully masked rows (NaN in the same places), F32/F16/BF16/F64, the fallback for
// broadcasting leading dims, thread-count independence, and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/functions/attention.h"
#include "ampforge/backends/cpu/gradcheck_testutil.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/core/tolerance.h"

using namespace ampforge;
using namespace ampforge::testutil;

namespace {

struct Result {
  Tensor out, dq, dk, dv;
};

// Runs one path on fresh leaves made from q, k, v (converted to `dtype`), backpropagating sum(out * g).
Result run(bool fused, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
           double scale, const Tensor& g, DType dtype) {
  auto make_leaf = [&](const Tensor& t) {
    Tensor x = ops::add_scalar(ops::to_dtype(t, dtype), 0.0);  // a fresh tensor
    x.requires_grad_();
    return x;
  };
  Tensor ql = make_leaf(q), kl = make_leaf(k), vl = make_leaf(v);
  Tensor out = fused ? scaled_dot_product_attention(ql, kl, vl, mask, causal, scale)
                     : detail::scaled_dot_product_attention_composite(ql, kl, vl, mask, causal, scale);
  sum(mul(out, ops::to_dtype(g, dtype))).backward();
  return {out, ql.grad(), kl.grad(), vl.grad()};
}

// |a - e| <= tol * (scale + |e|) with scale = max(1, max |e|) (core/tolerance.h's rule); NaN where e is NaN.
void expect_near(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined() && expected.defined()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = ops::to_dtype(actual, DType::F64).tolist<double>();
  const std::vector<double> e = ops::to_dtype(expected, DType::F64).tolist<double>();
  double scale = 1;
  for (double x : e)
    if (std::isfinite(x)) scale = std::max(scale, std::abs(x));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = std::isnan(e[i]) ? std::isnan(a[i]) : std::abs(a[i] - e[i]) <= tol * (scale + std::abs(e[i]));
    if (!ok) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ (tol " << tol << ", scale "
                    << scale << "); first at " << first << ": fused " << (first >= 0 ? a[first] : 0.0)
                    << ", composite " << (first >= 0 ? e[first] : 0.0);
}

Tensor bool_mask(const Shape& s, uint64_t seed, double keep) {
  Generator gen(seed);
  return ops::compare(OpId::lt, ops::rand(s, DType::F32, kCPU, &gen), ops::full(Shape{}, keep));
}

struct Case {
  std::string name;
  Shape q, k, v;
  Shape mask;  // empty: no mask
  bool causal = false;
  double scale = 0;
};

std::vector<Case> cases() {
  return {
      {"odd_sizes", {2, 3, 37, 20}, {2, 3, 45, 20}, {2, 3, 45, 13}, {}, false, 0},
      {"causal_tq_gt_tk", {2, 2, 50, 16}, {2, 2, 33, 16}, {2, 2, 33, 24}, {}, true, 0},
      {"causal_tq_lt_tk", {1, 3, 19, 8}, {1, 3, 70, 8}, {1, 3, 70, 5}, {}, true, 0.7},
      {"mask_over_heads_queries", {2, 3, 21, 12}, {2, 3, 40, 12}, {2, 3, 40, 12}, {2, 1, 1, 40}, false, 0},
      {"mask_2d", {2, 2, 33, 9}, {2, 2, 65, 9}, {2, 2, 65, 7}, {33, 65}, true, 0},
      {"mask_per_head", {2, 3, 17, 6}, {2, 3, 29, 6}, {2, 3, 29, 10}, {1, 3, 17, 29}, false, 0},
      {"mask_full", {2, 2, 9, 4}, {2, 2, 11, 4}, {2, 2, 11, 4}, {2, 2, 9, 11}, true, 0},
      {"mask_materialised_5d", {2, 2, 3, 7, 5}, {2, 2, 3, 12, 5}, {2, 2, 3, 12, 6}, {2, 1, 3, 1, 12}, false, 0},
      {"three_d", {4, 31, 16}, {4, 33, 16}, {4, 33, 16}, {}, true, 0},
      {"two_d", {13, 8}, {27, 8}, {27, 3}, {13, 1}, false, 0},
  };
}

void compare_case(const Case& c, DType dtype) {
  const std::string what = c.name + " " + std::string(dtype_name(dtype));
  Generator gen(1234);
  Tensor q = ops::to_dtype(ops::randn(c.q, DType::F32, kCPU, &gen), dtype);
  Tensor k = ops::to_dtype(ops::randn(c.k, DType::F32, kCPU, &gen), dtype);
  Tensor v = ops::to_dtype(ops::randn(c.v, DType::F32, kCPU, &gen), dtype);
  Shape os = c.q;
  os[os.size() - 1] = c.v[c.v.size() - 1];
  Tensor g = ops::to_dtype(ops::randn(os, DType::F32, kCPU, &gen), dtype);
  Tensor mask = c.mask.size() ? bool_mask(c.mask, 99, 0.7) : Tensor();
  // The reference: the composite in F64 (F64 inputs) or F32 on the same (rounded) values.
  const DType ref = dtype == DType::F64 ? DType::F64 : DType::F32;
  Result f = run(true, q, k, v, mask, c.causal, c.scale, g, dtype);
  Result e = run(false, q, k, v, mask, c.causal, c.scale, g, ref);
  EXPECT_EQ(f.out.dtype(), dtype) << what;
  EXPECT_EQ(f.dq.dtype(), dtype) << what;
  double tol = 4 * tolerance(dtype).rtol;
  if (dtype == DType::F64) tol = 1e-12;
  if (dtype == DType::F32) tol = 1e-5;
  expect_near(f.out, e.out, tol, what + " out");
  expect_near(f.dq, e.dq, tol, what + " dq");
  expect_near(f.dk, e.dk, tol, what + " dk");
  expect_near(f.dv, e.dv, tol, what + " dv");
}

std::set<int>* g_seen = nullptr;
void* on_begin(OpId op, const KernelArgs&) {
  if (g_seen) g_seen->insert(static_cast<int>(op));
  return nullptr;
}
void on_end(void*) {}

// Which ops scaled_dot_product_attention dispatches for these operands.
std::set<int> dispatched(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  std::set<int> seen;
  g_seen = &seen;
  const DispatchObserver obs{on_begin, on_end};
  set_dispatch_observer(&obs);
  Tensor out = scaled_dot_product_attention(q, k, v, mask, false, 0);
  set_dispatch_observer(nullptr);
  g_seen = nullptr;
  return seen;
}

}  // namespace

TEST(Attention, FusedMatchesCompositeF32) {
  for (const Case& c : cases()) compare_case(c, DType::F32);
}

TEST(Attention, FusedMatchesCompositeF64) {
  for (const Case& c : cases()) compare_case(c, DType::F64);
}

TEST(Attention, FusedMatchesComposite16Bit) {
  for (DType dt : {DType::F16, DType::BF16})
    for (const Case& c : cases()) compare_case(c, dt);
}

TEST(Attention, FullyMaskedRowsGiveNaNAsTheComposite) {
  // Batch 0, query row 2 attends nothing; batch 1 row 0 attends nothing (with causal, only key 0 was left).
  const int64_t Tq = 5, Tk = 6;
  std::vector<float> keep(static_cast<size_t>(2 * Tq * Tk), 1.0f);
  for (int64_t j = 0; j < Tk; ++j) keep[static_cast<size_t>(2 * Tk + j)] = 0.0f;
  keep[static_cast<size_t>(Tq * Tk + 0)] = 0.0f;
  Tensor mask = ops::compare(OpId::gt, Tensor::from_vector<float>(keep, Shape{2, 1, Tq, Tk}), ops::full(Shape{}, 0.5));
  Generator gen(5);
  Tensor q = ops::randn({2, 2, Tq, 4}, DType::F64, kCPU, &gen), k = ops::randn({2, 2, Tk, 4}, DType::F64, kCPU, &gen);
  Tensor v = ops::randn({2, 2, Tk, 3}, DType::F64, kCPU, &gen), g = ops::randn({2, 2, Tq, 3}, DType::F64, kCPU, &gen);
  for (bool causal : {false, true}) {
    Result f = run(true, q, k, v, mask, causal, 0, g, DType::F64);
    Result e = run(false, q, k, v, mask, causal, 0, g, DType::F64);
    const std::string what = causal ? "causal" : "not causal";
    EXPECT_TRUE(std::isnan(f.out.tolist<double>()[2 * 3])) << what;  // (0, 0, 2, 0)
    expect_near(f.out, e.out, 1e-12, what + " out");
    expect_near(f.dq, e.dq, 1e-12, what + " dq");
    expect_near(f.dk, e.dk, 1e-12, what + " dk");
    expect_near(f.dv, e.dv, 1e-12, what + " dv");
  }
}

TEST(Attention, FusedOpIsDispatchedAndBroadcastFallsBack) {
  Generator gen(7);
  Tensor q = ops::randn({2, 3, 5, 4}, DType::F32, kCPU, &gen), k = ops::randn({2, 3, 6, 4}, DType::F32, kCPU, &gen);
  Tensor v = ops::randn({2, 3, 6, 4}, DType::F32, kCPU, &gen);
  std::set<int> seen = dispatched(q, k, v, Tensor());
  EXPECT_TRUE(seen.count(static_cast<int>(OpId::attention)));
  EXPECT_FALSE(seen.count(static_cast<int>(OpId::softmax)));
  // Leading dims that only broadcast (k, v shared over the batch): the composite.
  Tensor kb = ops::randn({1, 3, 6, 4}, DType::F32, kCPU, &gen), vb = ops::randn({1, 3, 6, 4}, DType::F32, kCPU, &gen);
  seen = dispatched(q, kb, vb, Tensor());
  EXPECT_FALSE(seen.count(static_cast<int>(OpId::attention)));
  EXPECT_TRUE(seen.count(static_cast<int>(OpId::softmax)));
  Tensor a = scaled_dot_product_attention(q, kb, vb, Tensor(), true, 0);
  Tensor b = scaled_dot_product_attention(q, ops::contiguous(ops::expand(kb, {2, 3, 6, 4})),
                                          ops::contiguous(ops::expand(vb, {2, 3, 6, 4})), Tensor(), true, 0);
  expect_near(a, b, 1e-5, "broadcast fallback vs fused");
}

TEST(Attention, SameBitsForAnyThreadCount) {
  Generator gen(8);
  Tensor q = ops::randn({2, 2, 45, 16}, DType::F32, kCPU, &gen), k = ops::randn({2, 2, 39, 16}, DType::F32, kCPU, &gen);
  Tensor v = ops::randn({2, 2, 39, 12}, DType::F32, kCPU, &gen), g = ops::randn({2, 2, 45, 12}, DType::F32, kCPU, &gen);
  Tensor mask = bool_mask({2, 1, 45, 39}, 3, 0.8);
  auto go = [&] { return run(true, q, k, v, mask, true, 0, g, DType::F32); };
  Result a = with_threads(1, go), b = with_threads(4, go);
  expect_bitwise_equal(a.out, b.out, "out");
  expect_bitwise_equal(a.dq, b.dq, "dq");
  expect_bitwise_equal(a.dk, b.dk, "dk");
  expect_bitwise_equal(a.dv, b.dv, "dv");
}

TEST(Attention, ErrorsNameTheOp) {
  Tensor q = ops::zeros({2, 4, 8}), k = ops::zeros({3, 5, 8}), v = ops::zeros({2, 5, 8});
  EXPECT_NE(error_message([&] { ops::attention(q, k, v, Tensor(), {}); }).find("attention"), std::string::npos);
  Tensor k2 = ops::zeros({2, 5, 8});
  const std::string bad_mask =
      error_message([&] { ops::attention(q, k2, v, ops::zeros({2, 4, 5}), {}); });
  EXPECT_NE(bad_mask.find("Bool mask"), std::string::npos) << bad_mask;
  const std::string bad_shape =
      error_message([&] { ops::attention(q, k2, v, bool_mask({3, 4, 5}, 1, 0.5), {}); });
  EXPECT_NE(bad_shape.find("attention"), std::string::npos) << bad_shape;
  const std::string bad_lse = error_message([&] {
    ops::attention_backward(ops::zeros({2, 4, 8}), q, k2, v, ops::zeros({2, 4, 8}), ops::zeros({2, 5}), Tensor(), {});
  });
  EXPECT_NE(bad_lse.find("attention_backward"), std::string::npos) << bad_lse;
}
