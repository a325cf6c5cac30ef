// ops/: max/avg/adaptive-avg pooling and nearest upsampling, forward and backward: validation (as PyTorch's
// checks), output sizes (PyTorch's formulas, ceil_mode included), allocation in the input's memory format,
// dispatch. The kernels accept any strides (they have a channels-last fast path), so inputs are not copied.
#include "ampforge/ops/ops.h"

namespace ampforge::ops {

namespace {

const char* const kDimName[2] = {"height", "width"};

void check_image(const Tensor& x, const char* what, const char* arg) {
  check_defined(x, what, arg);
  check_float(x, what, arg);
  AF_CHECK(x.dim() == 4, "{}: expected a 4-D {} (N, C, H, W), got shape {}", what, arg, x.shape().str());
}

void check_input_shape(const Shape& s, const char* what) {
  AF_CHECK(s.size() == 4, "{}: expected a 4-D input shape (N, C, H, W), got {}", what, s.str());
  AF_CHECK(s[0] >= 0 && s[1] > 0 && s[2] > 0 && s[3] > 0,
           "{}: input channels, height and width must be non-zero (batch may be 0), got shape {}", what, s.str());
}

// Floor division for a possibly negative numerator (positive d).
int64_t floor_div(int64_t a, int64_t d) { return a >= 0 ? a / d : -((-a + d - 1) / d); }

// Validates pooling attrs against an input shape and returns the output shape.
Shape pool_check(const char* what, const Shape& xs, const Pool2dAttrs& a, bool allow_dilation) {
  check_input_shape(xs, what);
  Shape out{xs[0], xs[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const char* dn = kDimName[i];
    AF_CHECK(a.kernel[i] > 0, "{}: kernel size must be positive, got {} in {}", what, a.kernel[i], dn);
    AF_CHECK(a.stride[i] > 0, "{}: stride must be positive, got {} in {}", what, a.stride[i], dn);
    AF_CHECK(a.padding[i] >= 0, "{}: padding must be non-negative, got {} in {}", what, a.padding[i], dn);
    AF_CHECK(a.dilation[i] > 0, "{}: dilation must be positive, got {} in {}", what, a.dilation[i], dn);
    AF_CHECK(allow_dilation || a.dilation[i] == 1, "{}: dilation is not supported (must be 1), got {} in {}", what,
             a.dilation[i], dn);
    AF_CHECK(a.padding[i] <= a.kernel[i] / 2,
             "{}: padding must be at most half the kernel size, got padding {} for kernel {} in {}", what, a.padding[i],
             a.kernel[i], dn);
    out[2 + i] = pool2d_output_size(xs[2 + i], a.kernel[i], a.stride[i], a.padding[i], a.dilation[i], a.ceil_mode);
  }
  AF_CHECK(out[2] >= 1 && out[3] >= 1,
           "{}: input of spatial size {}x{} is too small for kernel {}x{} (padding {}x{}, dilation {}x{}): the output "
           "would be {}x{}",
           what, xs[2], xs[3], a.kernel[0], a.kernel[1], a.padding[0], a.padding[1], a.dilation[0], a.dilation[1],
           out[2], out[3]);
  return out;
}

MemoryFormat grad_format(MemoryFormat format, const Tensor& grad_out) {
  return format == MemoryFormat::Preserve ? image_memory_format(grad_out) : format;
}

void check_grad(const Tensor& grad_out, const Shape& expected, const char* what) {
  check_image(grad_out, what, "grad_output");
  AF_CHECK(grad_out.shape() == expected, "{}: grad_output must have the forward output's shape {}, got {}", what,
           expected.str(), grad_out.shape().str());
}

}  // namespace

int64_t pool2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                           bool ceil_mode) {
  const int64_t span = in + 2 * padding - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = floor_div(span, stride) + 1;
  // ceil_mode: the last window must start inside the input or the left padding.
  if (ceil_mode && (out - 1) * stride >= in + padding) --out;
  return out;
}

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dAttrs& attrs) {
  check_image(x, "max_pool2d", "input");
  const Shape os = pool_check("max_pool2d", x.shape(), attrs, true);
  const MemoryFormat fmt = image_memory_format(x);
  Tensor out = Tensor::empty(os, x.dtype(), x.device(), fmt);
  Tensor idx = Tensor::empty(os, DType::I64, x.device(), fmt);
  dispatch(OpId::max_pool2d, x.device(), {x}, {out, idx}, &attrs);
  return {out, idx};
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dAttrs& attrs, MemoryFormat format) {
  const char* what = "max_pool2d_backward";
  check_grad(grad_out, pool_check(what, input_shape, attrs, true), what);
  check_defined(indices, what, "indices");
  check_same_device(grad_out, indices, what);
  AF_CHECK(indices.dtype() == DType::I64 && indices.shape() == grad_out.shape(),
           "{}: indices must be I64 of shape {}, got {} of shape {}", what, grad_out.shape().str(),
           dtype_name(indices.dtype()), indices.shape().str());
  Tensor gin = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device(), grad_format(format, grad_out));
  dispatch(OpId::max_pool2d_backward, grad_out.device(), {grad_out, indices}, {gin}, &attrs);
  return gin;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dAttrs& attrs) {
  check_image(x, "avg_pool2d", "input");
  const Shape os = pool_check("avg_pool2d", x.shape(), attrs, false);
  Tensor out = Tensor::empty(os, x.dtype(), x.device(), image_memory_format(x));
  dispatch(OpId::avg_pool2d, x.device(), {x}, {out}, &attrs);
  return out;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dAttrs& attrs,
                           MemoryFormat format) {
  const char* what = "avg_pool2d_backward";
  check_grad(grad_out, pool_check(what, input_shape, attrs, false), what);
  Tensor gin = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device(), grad_format(format, grad_out));
  dispatch(OpId::avg_pool2d_backward, grad_out.device(), {grad_out}, {gin}, &attrs);
  return gin;
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  const char* what = "adaptive_avg_pool2d";
  check_image(x, what, "input");
  check_input_shape(x.shape(), what);
  AF_CHECK(out_h > 0 && out_w > 0, "{}: output size must be positive, got {}x{}", what, out_h, out_w);
  Pool2dAttrs attrs;
  attrs.output_size[0] = out_h;
  attrs.output_size[1] = out_w;
  Tensor out = Tensor::empty(Shape{x.size(0), x.size(1), out_h, out_w}, x.dtype(), x.device(), image_memory_format(x));
  dispatch(OpId::adaptive_avg_pool2d, x.device(), {x}, {out}, &attrs);
  return out;
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, MemoryFormat format) {
  const char* what = "adaptive_avg_pool2d_backward";
  check_input_shape(input_shape, what);
  check_image(grad_out, what, "grad_output");
  AF_CHECK(grad_out.size(0) == input_shape[0] && grad_out.size(1) == input_shape[1] && grad_out.size(2) > 0 &&
               grad_out.size(3) > 0,
           "{}: grad_output shape {} does not match input shape {} (same N and C, positive output size expected)", what,
           grad_out.shape().str(), input_shape.str());
  Pool2dAttrs attrs;
  attrs.output_size[0] = grad_out.size(2);
  attrs.output_size[1] = grad_out.size(3);
  Tensor gin = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device(), grad_format(format, grad_out));
  dispatch(OpId::adaptive_avg_pool2d_backward, grad_out.device(), {grad_out}, {gin}, &attrs);
  return gin;
}

Tensor upsample_nearest2d(const Tensor& x, int64_t scale_h, int64_t scale_w) {
  const char* what = "upsample_nearest2d";
  check_image(x, what, "input");
  check_input_shape(x.shape(), what);
  AF_CHECK(scale_h >= 1 && scale_w >= 1, "{}: scale factors must be integers >= 1, got {} and {}", what, scale_h,
           scale_w);
  UpsampleAttrs attrs{scale_h, scale_w};
  Tensor out = Tensor::empty(Shape{x.size(0), x.size(1), x.size(2) * scale_h, x.size(3) * scale_w}, x.dtype(),
                             x.device(), image_memory_format(x));
  dispatch(OpId::upsample_nearest2d, x.device(), {x}, {out}, &attrs);
  return out;
}

Tensor upsample_nearest2d_backward(const Tensor& grad_out, const Shape& input_shape, int64_t scale_h, int64_t scale_w,
                                   MemoryFormat format) {
  const char* what = "upsample_nearest2d_backward";
  check_input_shape(input_shape, what);
  AF_CHECK(scale_h >= 1 && scale_w >= 1, "{}: scale factors must be integers >= 1, got {} and {}", what, scale_h,
           scale_w);
  check_grad(grad_out, Shape{input_shape[0], input_shape[1], input_shape[2] * scale_h, input_shape[3] * scale_w}, what);
  UpsampleAttrs attrs{scale_h, scale_w};
  Tensor gin = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device(), grad_format(format, grad_out));
  dispatch(OpId::upsample_nearest2d_backward, grad_out.device(), {grad_out}, {gin}, &attrs);
  return gin;
}

}  // namespace ampforge::ops
