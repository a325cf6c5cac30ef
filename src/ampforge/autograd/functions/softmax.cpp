// Differentiable softmax, log_softmax, cross_entropy, binary_cross_entropy_with_logits, and the composite
// scaled_dot_product_attention.
//   softmax / log_softmax / losses run in F32 under autocast (op list: F32); their backward formulas are the
//   fused backward kernels, which read the forward output (softmax) or the saved log-sum-exp (cross entropy).
//   scaled_dot_product_attention calls the fused `attention` op (flash-style on CUDA: the (Tq, Tk) scores are
//   never materialised) and records attention_backward, when ops::attention_applies(): q, k, v of one dtype
//   and device with identical leading dims, non-empty, and on CUDA head dims up to 128. Otherwise (leading dims
//   that only broadcast, mixed dtypes, larger head dims on CUDA, empty operands) it falls back to the composite
//   written with differentiable functions (matmul, where, softmax), which autograd differentiates. Both paths
//   give NaN for a row with every key masked and the same gradients for it (dq row 0, dv NaN). Under autocast
//   q, k, v are cast like matmul's inputs (the Lower category); the composite's softmax runs in F32, the fused
//   kernels compute in F32 throughout (F64 for F64 inputs on the CPU).
#include <array>
#include <cmath>
#include <limits>

#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions/attention.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::SavedTensor;
using autograd::needs_grad;
using autograd::record;

Tensor softmax(const Tensor& x_in, int64_t dim) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::softmax, {&x});
  Tensor out = ops::softmax(x, dim);
  if (needs_grad({&x}))
    record("SoftmaxBackward", {x}, {out}, [dim, Y = SavedTensor(out)](const Grads& g) -> Grads {
      return {ops::softmax_backward(g[0], Y.get(), dim)};
    });
  return out;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::log_softmax, {&x});
  Tensor out = ops::log_softmax(x, dim);
  if (needs_grad({&x}))
    record("LogSoftmaxBackward", {x}, {out}, [dim, Y = SavedTensor(out)](const Grads& g) -> Grads {
      return {ops::log_softmax_backward(g[0], Y.get(), dim)};
    });
  return out;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, const CrossEntropyAttrs& attrs) {
  Tensor logits = logits_in;
  autograd::autocast_inputs(OpId::cross_entropy, {&logits});
  ops::CrossEntropyResult r = ops::cross_entropy(logits, target, attrs);
  if (needs_grad({&logits}))
    record("CrossEntropyBackward", {logits}, {r.loss},
           [attrs, L = SavedTensor(logits), T = SavedTensor(target), S = SavedTensor(r.lse)](const Grads& g) -> Grads {
             return {ops::cross_entropy_backward(g[0], L.get(), T.get(), S.get(), attrs)};
           });
  return r.loss;
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits_in, const Tensor& target_in, Reduction reduction) {
  Tensor x = logits_in, t = target_in;
  autograd::autocast_inputs(OpId::bce_with_logits, {&x, &t});
  Tensor out = ops::bce_with_logits(x, t, reduction);
  if (needs_grad({&x, &t})) {
    const bool gx = x.requires_grad(), gt = t.defined() && t.requires_grad();
    const double n = static_cast<double>(x.numel());
    record("BinaryCrossEntropyWithLogitsBackward", {x, t}, {out},
           [gx, gt, reduction, n, X = SavedTensor(x), T = SavedTensor(t)](const Grads& g) -> Grads {
             Tensor xx = X.get();
             Tensor dx = gx ? ops::bce_with_logits_backward(g[0], xx, T.get(), reduction) : Tensor();
             Tensor dt;
             if (gt) {  // d/dt [max(x,0) - x t + log(1 + exp(-|x|))] = -x
               const double s = reduction == Reduction::Mean ? -1.0 / n : -1.0;
               dt = ops::mul_scalar(ops::mul(xx, g[0]), s);
             }
             return {dx, dt};
           });
  }
  return out;
}

namespace {

const char* const kSdpa = "scaled_dot_product_attention";

// Checks what both paths need; returns q, k, v after autocast.
std::array<Tensor, 3> sdpa_inputs(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in) {
  const char* what = kSdpa;
  check_defined(q_in, what, "query");
  check_defined(k_in, what, "key");
  check_defined(v_in, what, "value");
  AF_CHECK(q_in.dim() >= 2 && k_in.dim() >= 2 && v_in.dim() >= 2,
           "{}: expected query, key, value of shape (..., T, D), got {}, {}, {}", what, q_in.shape().str(),
           k_in.shape().str(), v_in.shape().str());
  AF_CHECK(q_in.size(-1) == k_in.size(-1), "{}: query and key must have the same head dim, got query {} and key {}",
           what, q_in.shape().str(), k_in.shape().str());
  AF_CHECK(k_in.size(-2) == v_in.size(-2),
           "{}: key and value must have the same sequence length, got key {} and value {}", what,
           k_in.shape().str(), v_in.shape().str());
  Tensor q = q_in, k = k_in, v = v_in;
  autograd::autocast_inputs(OpId::matmul, {&q, &k, &v});  // attention is in PyTorch's lower-precision list
  return {q, k, v};
}

Tensor sdpa_composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                      double scale) {
  const char* what = kSdpa;
  const int64_t D = q.size(-1), Tq = q.size(-2), Tk = k.size(-2);
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  Tensor scores = mul(matmul(q, transpose(k, k.dim() - 2, k.dim() - 1)), s);  // (..., Tq, Tk)
  Tensor neg_inf;
  auto masked = [&](const Tensor& keep) {
    if (!neg_inf.defined())
      neg_inf = ops::full(Shape{}, -std::numeric_limits<double>::infinity(), scores.dtype(), scores.device());
    return where(keep, scores, neg_inf);
  };
  if (causal) {  // query i attends to keys j <= i (top-left aligned, as torch's is_causal)
    Tensor i = ops::view_as_shape(ops::arange(0, static_cast<double>(Tq), 1, DType::I64, scores.device()), {Tq, 1});
    Tensor j = ops::view_as_shape(ops::arange(0, static_cast<double>(Tk), 1, DType::I64, scores.device()), {1, Tk});
    scores = masked(ops::compare(OpId::ge, i, j));
  }
  if (mask.defined()) {
    AF_CHECK(mask.dtype() == DType::Bool, "{}: expected a Bool mask (true = attend), got dtype {}", what,
             dtype_name(mask.dtype()));
    AF_CHECK(broadcast_shapes(mask.shape(), scores.shape(), what) == scores.shape(),
             "{}: mask of shape {} does not broadcast to the attention scores' shape {}", what, mask.shape().str(),
             scores.shape().str());
    scores = masked(mask);
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace

Tensor detail::scaled_dot_product_attention_composite(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                                      const Tensor& mask, bool causal, double scale) {
  auto [q, k, v] = sdpa_inputs(q_in, k_in, v_in);
  return sdpa_composite(q, k, v, mask, causal, scale);
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                                    bool causal, double scale) {
  auto [q, k, v] = sdpa_inputs(q_in, k_in, v_in);
  if (!ops::attention_applies(q, k, v, mask)) return sdpa_composite(q, k, v, mask, causal, scale);
  AttentionAttrs at;
  at.causal = causal;
  at.scale = scale;
  ops::AttentionResult r = ops::attention(q, k, v, mask, at);
  if (needs_grad({&q, &k, &v}))
    record("ScaledDotProductAttentionBackward", {q, k, v}, {r.out},
           [at, Q = SavedTensor(q), K = SavedTensor(k), V = SavedTensor(v), M = SavedTensor(mask),
            O = SavedTensor(r.out), L = SavedTensor(r.lse)](const Grads& g) -> Grads {
             ops::AttentionGrads d =
                 ops::attention_backward(g[0], Q.get(), K.get(), V.get(), O.get(), L.get(), M.get(), at);
             return {d.dq, d.dk, d.dv};
           });
  return r.out;
}

}  // namespace ampforge
