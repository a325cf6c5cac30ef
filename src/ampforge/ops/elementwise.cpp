// ops/: elementwise unary, binary, comparison, where.
#include <cmath>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {

MemoryFormat output_format(const Tensor& a, const Shape& out_shape) {
  // image_memory_format, not suggest_memory_format: a channel slice of a channels-last image (YOLOv8's C2f
  // split, the slices of a concatenation's gradient) is dense in neither layout, and a Contiguous result of
  // two such slices then met channels-last gradients in the next add, a transposing add (the engine's gradient
  // sums of YOLOv8 are measured in docs/PERFORMANCE.md).
  if (a.shape() == out_shape && out_shape.size() == 4) return image_memory_format(a);
  return MemoryFormat::Contiguous;
}

namespace {

bool is_float_only(OpId op) {
  switch (op) {
    case OpId::exp:
    case OpId::log:
    case OpId::sqrt:
    case OpId::rsqrt:
    case OpId::relu:
    case OpId::gelu:
    case OpId::silu:
    case OpId::sigmoid:
    case OpId::tanh:
    case OpId::atan:
    case OpId::pow_scalar:
    case OpId::div:
    case OpId::pow:
      return true;
    default:
      return false;
  }
}

// The operand as the kernel reads it for a result of dtype dt: unconverted when the kernel converts 16-bit
// floats itself (dispatch.h), else converted (a 0-dim operand costs one element).
Tensor operand(OpId op, const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  if (dt == DType::F32 && dtype_is_16bit_float(t.dtype()) && accepts_mixed_float_inputs(op, t.device().type)) return t;
  return to_dtype(t, dt);
}

int category(DType d) { return d == DType::Bool ? 0 : dtype_is_float(d) ? 2 : 1; }

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  const bool za = a.dim() == 0, zb = b.dim() == 0;
  if (za == zb) return promote_types(a.dtype(), b.dtype());
  // A 0-dim operand counts only when it is of a higher category (Bool < integer < floating) than the
  // dimensioned one: f16 activations * an F32 0-dim tensor -> f16; an integer tensor * an F32 0-dim -> F32.
  const DType dim = za ? b.dtype() : a.dtype(), zero = za ? a.dtype() : b.dtype();
  return category(zero) > category(dim) ? promote_types(dim, zero) : dim;
}

Tensor unary(OpId op, const Tensor& x_in, const void* attrs) {
  check_defined(x_in, op_name(op), "input");
  Tensor x = x_in;
  if (is_float_only(op) && !x.is_floating_point()) x = to_dtype(x, DType::F32);
  AF_CHECK(x.dtype() != DType::Bool, "{}: Bool tensors are not supported", op_name(op));
  Tensor out = empty_like(x, output_format(x, x.shape()));
  dispatch(op, x.device(), {x}, {out}, attrs);
  return out;
}

namespace {
// PyTorch: a floating scalar with an integer tensor gives a floating result (the default dtype, F32). A C++
// double cannot say whether it was written 2 or 2.0, so an integral value keeps integer arithmetic (torch's
// `t * 2`) and a fractional, infinite or NaN one computes in F32 instead of truncating to 0.
Tensor scalar_operand(const Tensor& x, double s) {
  const bool fractional = !std::isfinite(s) || s != std::floor(s);
  return !x.is_floating_point() && x.dtype() != DType::Bool && fractional ? to_dtype(x, DType::F32) : x;
}
}  // namespace

Tensor add_scalar(const Tensor& x, double s) {
  ScalarAttrs at{s};
  return unary(OpId::add_scalar, scalar_operand(x, s), &at);
}
Tensor mul_scalar(const Tensor& x, double s) {
  ScalarAttrs at{s};
  return unary(OpId::mul_scalar, scalar_operand(x, s), &at);
}
Tensor pow_scalar(const Tensor& x, double s) {
  ScalarAttrs at{s};
  return unary(OpId::pow_scalar, x, &at);
}
void mul_scalar_(const Tensor& x, double s) {
  ScalarAttrs at{s};
  dispatch(OpId::mul_scalar, x.device(), {x}, {x}, &at);
  x.storage()->bump_version();
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  AF_CHECK(min || max, "clamp: at least one of min and max must be given");
  if (min && max) AF_CHECK(*min <= *max, "clamp: min ({}) must not exceed max ({})", *min, *max);
  ClampAttrs at{min.value_or(0), max.value_or(0), min.has_value(), max.has_value()};
  return unary(OpId::clamp, x, &at);
}

Tensor gelu(const Tensor& x, GeluApprox approximate) {
  GeluAttrs at{approximate};
  return unary(OpId::gelu, x, &at);
}

Tensor binary(OpId op, const Tensor& a_in, const Tensor& b_in, const void* attrs) {
  check_defined(a_in, op_name(op), "input");
  check_defined(b_in, op_name(op), "other");
  check_same_device(a_in, b_in, op_name(op));
  const Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), op_name(op));
  DType dt = result_type(a_in, b_in);
  if (is_float_only(op) && !dtype_is_float(dt)) dt = DType::F32;  // true division, as in PyTorch
  AF_CHECK(dt != DType::Bool, "{}: arithmetic on Bool tensors is not supported", op_name(op));
  Tensor a = operand(op, a_in, dt), b = operand(op, b_in, dt);
  MemoryFormat fmt = output_format(a, shape);
  if (fmt == MemoryFormat::Contiguous) fmt = output_format(b, shape);
  Tensor out = Tensor::empty(shape, dt, a.device(), fmt);
  dispatch(op, a.device(), {a, b}, {out}, attrs);
  return out;
}

void binary_(OpId op, const Tensor& a, const Tensor& b_in) {
  check_defined(a, op_name(op), "self");
  check_defined(b_in, op_name(op), "other");
  check_same_device(a, b_in, op_name(op));
  const Shape shape = broadcast_shapes(a.shape(), b_in.shape(), op_name(op));
  AF_CHECK(shape == a.shape(), "{}_: the result shape {} differs from the in-place target's shape {}", op_name(op),
           shape.str(), a.shape().str());
  Tensor b = operand(op, b_in, a.dtype());
  dispatch(op, a.device(), {a, b}, {a});
  a.storage()->bump_version();
}

Tensor compare(OpId op, const Tensor& a_in, const Tensor& b_in) {
  check_defined(a_in, op_name(op), "input");
  check_defined(b_in, op_name(op), "other");
  check_same_device(a_in, b_in, op_name(op));
  const Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), op_name(op));
  const DType dt = result_type(a_in, b_in);
  Tensor a = operand(op, a_in, dt), b = operand(op, b_in, dt);
  Tensor out = Tensor::empty(shape, DType::Bool, a.device(), output_format(a, shape));
  dispatch(op, a.device(), {a, b}, {out});
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  check_defined(cond, "where", "condition");
  check_defined(a_in, "where", "input");
  check_defined(b_in, "where", "other");
  AF_CHECK(cond.dtype() == DType::Bool, "where: the condition must be a Bool tensor, got {}", dtype_name(cond.dtype()));
  check_same_device(cond, a_in, "where");
  check_same_device(a_in, b_in, "where");
  Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a_in.shape(), b_in.shape(), "where"), "where");
  const DType dt = result_type(a_in, b_in);
  Tensor a = to_dtype(a_in, dt), b = to_dtype(b_in, dt);
  Tensor out = Tensor::empty(shape, dt, a.device(), output_format(a, shape));
  dispatch(OpId::where, a.device(), {cond, a, b}, {out});
  return out;
}

Tensor pointwise_backward(OpId op, const Tensor& grad, const Tensor& saved, const void* attrs) {
  check_same_device(grad, saved, op_name(op));
  AF_ASSERT(grad.shape() == saved.shape(), "{}: grad shape {} vs saved {}", op_name(op), grad.shape().str(),
            saved.shape().str());
  Tensor g = to_dtype(grad, saved.dtype());
  Tensor out = empty_like(saved, output_format(saved, saved.shape()));
  dispatch(op, saved.device(), {g, saved}, {out}, attrs);
  return out;
}

}  // namespace ampforge::ops
