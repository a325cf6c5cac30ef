// ops/: softmax, log_softmax, cross_entropy, bce_with_logits and their backward ops: validation,
// contiguous operands, output allocation, dispatch. Kernels see contiguous tensors only.
#include <cmath>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {
namespace {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

// Softmax-family input: floating, contiguous, at least 1-D (a 0-d tensor is treated as shape [1]).
Tensor softmax_input(const Tensor& x, const char* what) {
  check_defined(x, what, "input");
  AF_CHECK(x.is_floating_point(), "{}: expected a floating-point input, got {} (convert it with .to(DType::F32))",
           what, dtype_name(x.dtype()));
  return contiguous(x);
}

Tensor softmax_fwd(OpId op, const Tensor& x_in, int64_t dim) {
  const char* what = op_name(op);
  Tensor x = softmax_input(x_in, what);
  const Shape shape = x.shape();
  if (x.dim() == 0) x = view_as_shape(x, Shape{1});
  SoftmaxAttrs at{wrap_dim(dim, std::max(x.dim(), 1), what)};
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(op, x.device(), {x}, {y}, &at);
  return shape.size() == 0 ? view_as_shape(y, shape) : y;
}

Tensor softmax_bwd(OpId op, const Tensor& grad, const Tensor& y_in, int64_t dim) {
  const char* what = op_name(op);
  check_defined(grad, what, "grad");
  check_defined(y_in, what, "output");
  check_same_device(grad, y_in, what);
  AF_CHECK(grad.shape() == y_in.shape(), "{}: grad shape {} differs from the output shape {}", what,
           grad.shape().str(), y_in.shape().str());
  Tensor y = contiguous(y_in);
  Tensor g = contiguous(to_dtype(grad, y.dtype()));
  const Shape shape = y.shape();
  if (y.dim() == 0) {
    y = view_as_shape(y, Shape{1});
    g = view_as_shape(g, Shape{1});
  }
  SoftmaxAttrs at{wrap_dim(dim, y.dim(), what)};
  Tensor gx = Tensor::empty(y.shape(), y.dtype(), y.device());
  dispatch(op, y.device(), {g, y}, {gx}, &at);
  return shape.size() == 0 ? view_as_shape(gx, shape) : gx;
}

DType stat_dtype(DType x) { return x == DType::F64 ? DType::F64 : DType::F32; }

// Shape of the per-row outputs of cross_entropy: logits' shape without dim 1.
Shape ce_row_shape(const Shape& logits) {
  Shape s;
  for (int d = 0; d < logits.size(); ++d)
    if (d != 1) s.push_back(logits[d]);
  return s;
}

Tensor ce_target(const Tensor& logits, const Tensor& target, const char* what) {
  check_defined(target, what, "target");
  check_same_device(logits, target, what);
  AF_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32,
           "{}: expected target of class indices (i64), got dtype {}; class-probability targets are not supported",
           what, dtype_name(target.dtype()));
  const Shape want = ce_row_shape(logits.shape());
  AF_CHECK(target.shape() == want, "{}: expected target of shape {} for logits of shape {} (logits without the class "
           "dim 1), got {}", what, want.str(), logits.shape().str(), target.shape().str());
  return contiguous(to_dtype(target, DType::I64));
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_fwd(OpId::softmax, x, dim); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_fwd(OpId::log_softmax, x, dim); }
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_bwd(OpId::softmax_backward, grad, y, dim);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_bwd(OpId::log_softmax_backward, grad, y, dim);
}

CrossEntropyResult cross_entropy(const Tensor& logits_in, const Tensor& target_in, const CrossEntropyAttrs& attrs) {
  const char* what = "cross_entropy";
  check_defined(logits_in, what, "logits");
  AF_CHECK(logits_in.is_floating_point(), "{}: expected floating-point logits, got {}", what,
           dtype_name(logits_in.dtype()));
  AF_CHECK(logits_in.dim() >= 2, "{}: expected logits of shape (N, C) or (N, C, d1, ...), got {}", what,
           logits_in.shape().str());
  AF_CHECK(logits_in.size(1) > 0, "{}: logits {} have no classes (dim 1 is 0)", what, logits_in.shape().str());
  AF_CHECK(attrs.label_smoothing >= 0.0 && attrs.label_smoothing <= 1.0,
           "{}: label_smoothing must be in [0, 1], got {}", what, attrs.label_smoothing);
  Tensor target = ce_target(logits_in, target_in, what);
  Tensor logits = contiguous(logits_in);
  const Shape rows = ce_row_shape(logits.shape());
  CrossEntropyResult r;
  r.loss = Tensor::empty(attrs.reduction == Reduction::None ? rows : Shape{}, logits.dtype(), logits.device());
  r.lse = Tensor::empty(rows, stat_dtype(logits.dtype()), logits.device());
  dispatch(OpId::cross_entropy, logits.device(), {logits, target}, {r.loss, r.lse}, &attrs);
  return r;
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits_in, const Tensor& target_in, const Tensor& lse,
                              const CrossEntropyAttrs& attrs) {
  const char* what = "cross_entropy_backward";
  check_defined(grad, what, "grad");
  check_defined(logits_in, what, "logits");
  check_defined(lse, what, "lse");
  Tensor target = ce_target(logits_in, target_in, what);
  Tensor logits = contiguous(logits_in);
  const Shape gshape = attrs.reduction == Reduction::None ? ce_row_shape(logits.shape()) : Shape{};
  AF_CHECK(grad.numel() == shape_numel(gshape), "{}: grad has shape {}, expected {} (reduction '{}')", what,
           grad.shape().str(), gshape.str(), reduction_name(attrs.reduction));
  Tensor g = contiguous(to_dtype(grad, logits.dtype()));
  Tensor gx = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  dispatch(OpId::cross_entropy_backward, logits.device(), {g, logits, target, contiguous(lse)}, {gx}, &attrs);
  return gx;
}

Tensor bce_with_logits(const Tensor& logits_in, const Tensor& target_in, Reduction reduction) {
  const char* what = "binary_cross_entropy_with_logits";
  check_defined(logits_in, what, "logits");
  check_defined(target_in, what, "target");
  check_same_device(logits_in, target_in, what);
  AF_CHECK(logits_in.is_floating_point(), "{}: expected floating-point logits, got {}", what,
           dtype_name(logits_in.dtype()));
  AF_CHECK(target_in.shape() == logits_in.shape(), "{}: target shape {} must equal the logits shape {}", what,
           target_in.shape().str(), logits_in.shape().str());
  Tensor x = contiguous(logits_in);
  Tensor t = contiguous(to_dtype(target_in, x.dtype()));
  BceAttrs at{reduction};
  Tensor loss = Tensor::empty(reduction == Reduction::None ? x.shape() : Shape{}, x.dtype(), x.device());
  dispatch(OpId::bce_with_logits, x.device(), {x, t}, {loss}, &at);
  return loss;
}

Tensor bce_with_logits_backward(const Tensor& grad, const Tensor& logits_in, const Tensor& target_in,
                                Reduction reduction) {
  const char* what = "binary_cross_entropy_with_logits_backward";
  check_defined(grad, what, "grad");
  Tensor x = contiguous(logits_in);
  Tensor t = contiguous(to_dtype(target_in, x.dtype()));
  const Shape gshape = reduction == Reduction::None ? x.shape() : Shape{};
  AF_CHECK(grad.numel() == shape_numel(gshape), "{}: grad has shape {}, expected {} (reduction '{}')", what,
           grad.shape().str(), gshape.str(), reduction_name(reduction));
  Tensor g = contiguous(to_dtype(grad, x.dtype()));
  BceAttrs at{reduction};
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  dispatch(OpId::bce_with_logits_backward, x.device(), {g, x, t}, {gx}, &at);
  return gx;
}

}  // namespace ampforge::ops
