// ops/: the fused attention op and its backward: validation, the (N, T, D) views the kernels see, the mask's
// (N1, N2, Tq, Tk) strided view, output allocation, dispatch. Contract: core/attrs.h (AttentionAttrs).
#include <cmath>

#include "ampforge/core/runtime.h"
#include "ampforge/ops/ops.h"

namespace ampforge::ops {
namespace {

DType stat_dtype(DType x) { return x == DType::F64 ? DType::F64 : DType::F32; }

Shape leading(const Tensor& t) {
  Shape s;
  for (int d = 0; d + 2 < t.dim(); ++d) s.push_back(t.size(d));
  return s;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape with_tail(const Shape& lead, std::initializer_list<int64_t> tail) {
  Shape s = lead;
  for (int64_t d : tail) s.push_back(d);
  return s;
}

struct Dims3 {
  Shape lead;
  int64_t N = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
};

// Validates q, k, v (and the mask) for `what`; returns the problem's sizes.
Dims3 check_qkv(const char* what, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  check_defined(q, what, "query");
  check_defined(k, what, "key");
  check_defined(v, what, "value");
  check_same_device(q, k, what);
  check_same_device(q, v, what);
  AF_CHECK(q.is_floating_point(), "{}: expected a floating-point query, got dtype {}", what, dtype_name(q.dtype()));
  AF_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(),
           "{}: expected query, key and value of one dtype, got {}, {}, {}", what, dtype_name(q.dtype()),
           dtype_name(k.dtype()), dtype_name(v.dtype()));
  AF_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
           "{}: expected query (..., Tq, D), key (..., Tk, D), value (..., Tk, Dv) of one rank >= 2, got {}, {}, {}",
           what, q.shape().str(), k.shape().str(), v.shape().str());
  Dims3 d;
  d.lead = leading(q);
  AF_CHECK(leading(k) == d.lead && leading(v) == d.lead,
           "{}: expected identical leading dims for query, key and value, got {}, {}, {}", what, q.shape().str(),
           k.shape().str(), v.shape().str());
  d.N = numel_of(d.lead);
  d.Tq = q.size(-2);
  d.Tk = k.size(-2);
  d.D = q.size(-1);
  d.Dv = v.size(-1);
  AF_CHECK(k.size(-1) == d.D, "{}: query and key must have the same head dim, got query {} and key {}", what,
           q.shape().str(), k.shape().str());
  AF_CHECK(v.size(-2) == d.Tk, "{}: key and value must have the same sequence length, got key {} and value {}",
           what, k.shape().str(), v.shape().str());
  if (mask.defined()) {
    check_same_device(q, mask, what);
    AF_CHECK(mask.dtype() == DType::Bool, "{}: expected a Bool mask (true = attend), got dtype {}", what,
             dtype_name(mask.dtype()));
    const Shape scores = with_tail(d.lead, {d.Tq, d.Tk});
    AF_CHECK(mask.dim() <= scores.size() && broadcast_shapes(mask.shape(), scores, what) == scores,
             "{}: mask of shape {} does not broadcast to the attention scores' shape {}", what, mask.shape().str(),
             scores.str());
  }
  return d;
}

// The mask as the kernels read it: (N1, N2, Tq, Tk) with N1 * N2 = N, a strided view of the caller's mask
// (broadcast dims have stride 0). Leading dims are merged where their strides allow; when more than two
// remain, the mask is materialised contiguous (N * Tq * Tk bytes).
Tensor kernel_mask(const Tensor& mask, const Dims3& d) {
  if (!mask.defined()) return Tensor();
  Tensor m = expand(mask, with_tail(d.lead, {d.Tq, d.Tk}));
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride) of the leading dims, size-1 dims dropped
  for (int i = 0; i < static_cast<int>(d.lead.size()); ++i)
    if (m.size(i) != 1) dims.emplace_back(m.size(i), m.stride(i));
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [size, stride] : dims) {
    if (!merged.empty() && merged.back().second == stride * size) {
      merged.back() = {merged.back().first * size, stride};
    } else {
      merged.emplace_back(size, stride);
    }
  }
  const int nd = m.dim();
  if (merged.size() > 2) {
    m = contiguous(m);
    return m.as_strided_raw(Shape{1, d.N, d.Tq, d.Tk}, Strides{0, d.Tq * d.Tk, d.Tk, 1}, m.offset());
  }
  while (merged.size() < 2) merged.insert(merged.begin(), std::make_pair(int64_t{1}, int64_t{0}));
  return m.as_strided_raw(Shape{merged[0].first, merged[1].first, d.Tq, d.Tk},
                          Strides{merged[0].second, merged[1].second, m.stride(nd - 2), m.stride(nd - 1)}, m.offset());
}

Tensor as_ntd(const Tensor& t, int64_t N) { return view_as_shape(contiguous(t), Shape{N, t.size(-2), t.size(-1)}); }

AttentionAttrs resolved(const AttentionAttrs& attrs, int64_t D) {
  AttentionAttrs a = attrs;
  if (a.scale == 0) a.scale = 1.0 / std::sqrt(static_cast<double>(D));
  return a;
}

}  // namespace

bool attention_applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  if (!q.defined() || !k.defined() || !v.defined()) return false;
  if (q.device() != k.device() || q.device() != v.device()) return false;
  if (mask.defined() && (mask.device() != q.device() || mask.dtype() != DType::Bool)) return false;
  if (!q.is_floating_point() || k.dtype() != q.dtype() || v.dtype() != q.dtype()) return false;
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim()) return false;
  if (leading(k) != leading(q) || leading(v) != leading(q)) return false;
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return false;
  if (q.size(-1) != k.size(-1) || k.size(-2) != v.size(-2)) return false;
  // A meta device standing for CUDA decides as CUDA.
  if (runtime::has_capability(q.device(), runtime::Capability::LimitedFusedAttention)) {
    if (q.dtype() != DType::F32 && q.dtype() != DType::F16 && q.dtype() != DType::BF16) return false;
    if (q.size(-1) > kAttentionMaxHeadDimCuda || v.size(-1) > kAttentionMaxHeadDimCuda) return false;
  }
  return true;
}

AttentionResult attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                          const AttentionAttrs& attrs) {
  const char* what = "attention";
  const Dims3 d = check_qkv(what, q_in, k_in, v_in, mask);
  const AttentionAttrs at = resolved(attrs, d.D);
  AttentionResult r;
  r.out = Tensor::empty(with_tail(d.lead, {d.Tq, d.Dv}), q_in.dtype(), q_in.device());
  r.lse = Tensor::empty(with_tail(d.lead, {d.Tq}), stat_dtype(q_in.dtype()), q_in.device());
  if (r.out.numel() == 0) return r;
  AF_CHECK(d.Tk > 0 && d.D > 0, "{}: empty key sequence or head dim (key {}) is not supported by the fused op",
           what, k_in.shape().str());
  Tensor q = as_ntd(q_in, d.N), k = as_ntd(k_in, d.N), v = as_ntd(v_in, d.N);
  Tensor out = view_as_shape(r.out, Shape{d.N, d.Tq, d.Dv});
  Tensor lse = view_as_shape(r.lse, Shape{d.N, d.Tq});
  if (mask.defined())
    dispatch(OpId::attention, q.device(), {q, k, v, kernel_mask(mask, d)}, {out, lse}, &at);
  else
    dispatch(OpId::attention, q.device(), {q, k, v}, {out, lse}, &at);
  return r;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                  const Tensor& out_in, const Tensor& lse_in, const Tensor& mask,
                                  const AttentionAttrs& attrs) {
  const char* what = "attention_backward";
  const Dims3 d = check_qkv(what, q_in, k_in, v_in, mask);
  check_defined(grad_out, what, "grad_out");
  check_defined(out_in, what, "out");
  check_defined(lse_in, what, "lse");
  const Shape out_shape = with_tail(d.lead, {d.Tq, d.Dv}), lse_shape = with_tail(d.lead, {d.Tq});
  AF_CHECK(grad_out.shape() == out_shape && out_in.shape() == out_shape,
           "{}: expected grad_out and out of shape {}, got {} and {}", what, out_shape.str(), grad_out.shape().str(),
           out_in.shape().str());
  AF_CHECK(lse_in.shape() == lse_shape && lse_in.dtype() == stat_dtype(q_in.dtype()),
           "{}: expected lse of shape {} and dtype {}, got {} ({})", what, lse_shape.str(),
           dtype_name(stat_dtype(q_in.dtype())), lse_in.shape().str(), dtype_name(lse_in.dtype()));
  check_same_device(q_in, grad_out, what);
  check_same_device(q_in, out_in, what);
  check_same_device(q_in, lse_in, what);
  const AttentionAttrs at = resolved(attrs, d.D);
  AttentionGrads g;
  g.dq = Tensor::empty(q_in.shape(), q_in.dtype(), q_in.device());
  g.dk = Tensor::empty(k_in.shape(), q_in.dtype(), q_in.device());
  g.dv = Tensor::empty(v_in.shape(), q_in.dtype(), q_in.device());
  if (g.dq.numel() == 0 && g.dk.numel() == 0 && g.dv.numel() == 0) return g;
  AF_CHECK(d.Tq > 0 && d.Tk > 0 && d.D > 0 && d.Dv > 0,
           "{}: empty sequences or head dims (query {}, value {}) are not supported by the fused op", what,
           q_in.shape().str(), v_in.shape().str());
  Tensor q = as_ntd(q_in, d.N), k = as_ntd(k_in, d.N), v = as_ntd(v_in, d.N);
  Tensor go = as_ntd(to_dtype(grad_out, q_in.dtype()), d.N);
  Tensor o = as_ntd(to_dtype(out_in, q_in.dtype()), d.N);
  Tensor lse = view_as_shape(contiguous(lse_in), Shape{d.N, d.Tq});
  Tensor dq = view_as_shape(g.dq, Shape{d.N, d.Tq, d.D});
  Tensor dk = view_as_shape(g.dk, Shape{d.N, d.Tk, d.D});
  Tensor dv = view_as_shape(g.dv, Shape{d.N, d.Tk, d.Dv});
  if (mask.defined())
    dispatch(OpId::attention_backward, q.device(), {go, q, k, v, o, lse, kernel_mask(mask, d)}, {dq, dk, dv}, &at);
  else
    dispatch(OpId::attention_backward, q.device(), {go, q, k, v, o, lse}, {dq, dk, dv}, &at);
  return g;
}

}  // namespace ampforge::ops
