// ops/: conv2d and its two backward kernels: validation, output allocation (channels-last when the input or
// the weight is, as PyTorch), dispatch. Output sizes follow PyTorch: out = floor((in + 2p - d*(k-1) - 1) / s) + 1.
#include <algorithm>

#include "ampforge/ops/ops.h"

namespace ampforge::ops {

namespace {
// Whether the strides grow in the order C, W, H, N (size-1 dims do not scale), i.e. the tensor was laid
// out channels-last, and the layout is not fully degenerate. Decides between the two layouts when size-1
// dims make both hold (a single-channel image, a 1x1 weight), as PyTorch's suggest_memory_format does.
bool strides_like_channels_last(const Tensor& x) {
  int64_t min = 0;
  for (int d : {1, 3, 2, 0}) {
    if (x.size(d) == 0 || x.stride(d) < min) return false;
    if (d == 0 && min == x.stride(1)) return false;
    min = x.stride(d) * std::max<int64_t>(x.size(d), 1);
  }
  return true;
}
}  // namespace

MemoryFormat image_memory_format(const Tensor& x) {
  if (x.dim() != 4) return MemoryFormat::Contiguous;
  if (!x.is_contiguous(MemoryFormat::ChannelsLast))
    return !x.is_contiguous() && strides_like_channels_last(x) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  if (!x.is_contiguous()) return MemoryFormat::ChannelsLast;
  // Both layouts describe the memory: the strides say which one was asked for. Keeping a channels-last
  // single-channel image or 1x1 weight channels-last keeps a channels-last network on its fast path.
  return strides_like_channels_last(x) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

MemoryFormat conv2d_memory_format(const Tensor& x, const Tensor& weight) {
  return image_memory_format(x) == MemoryFormat::ChannelsLast ||
                 image_memory_format(weight) == MemoryFormat::ChannelsLast
             ? MemoryFormat::ChannelsLast
             : MemoryFormat::Contiguous;
}

namespace {
MemoryFormat grad_format(MemoryFormat format, const Tensor& grad_out) {
  return format == MemoryFormat::Preserve ? image_memory_format(grad_out) : format;
}
}  // namespace

Tensor to_image_layout(const Tensor& x, MemoryFormat format) {
  if (x.is_contiguous(format)) return x;
  return contiguous(x, format);
}

namespace {

// Checks shared by the three conv ops; `what` names the op. Returns the output shape.
Shape conv_check(const char* what, const Shape& xs, const Shape& ws, const Conv2dAttrs& a) {
  AF_CHECK(xs.size() == 4, "{}: expected a 4-D input (N, C, H, W), got shape {}", what, xs.str());
  AF_CHECK(ws.size() == 4, "{}: expected a 4-D weight (C_out, C_in / groups, kH, kW), got shape {}", what, ws.str());
  const char* dim_name[2] = {"height", "width"};
  for (int i = 0; i < 2; ++i) {
    AF_CHECK(a.stride[i] > 0, "{}: stride must be positive, got {} in {}", what, a.stride[i], dim_name[i]);
    AF_CHECK(a.dilation[i] > 0, "{}: dilation must be positive, got {} in {}", what, a.dilation[i], dim_name[i]);
    AF_CHECK(a.padding[i] >= 0, "{}: padding must be non-negative, got {} in {}", what, a.padding[i], dim_name[i]);
  }
  AF_CHECK(a.groups > 0, "{}: groups must be positive, got {}", what, a.groups);
  const int64_t C = xs[1], Co = ws[0];
  AF_CHECK(C > 0 && xs[2] > 0 && xs[3] > 0, "{}: input channels, height and width must be non-zero, got shape {}", what,
           xs.str());
  AF_CHECK(Co > 0 && ws[1] > 0 && ws[2] > 0 && ws[3] > 0, "{}: weight sizes must be non-zero, got shape {}", what,
           ws.str());
  AF_CHECK(C % a.groups == 0, "{}: groups ({}) must divide the input channels ({})", what, a.groups, C);
  AF_CHECK(Co % a.groups == 0, "{}: groups ({}) must divide the output channels ({}, weight shape {})", what, a.groups,
           Co, ws.str());
  AF_CHECK(ws[1] * a.groups == C,
           "{}: input has {} channels but the weight (shape {}) expects weight.size(1) * groups = {} * {} = {}", what,
           C, ws.str(), ws[1], a.groups, ws[1] * a.groups);
  Shape out{xs[0], Co, 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t in = xs[2 + i], k = ws[2 + i];
    const int64_t eff = a.dilation[i] * (k - 1) + 1, padded = in + 2 * a.padding[i];
    AF_CHECK(eff <= padded,
             "{}: kernel {} ({} with dilation {}: effective {}) is larger than the padded input {} ({} + 2 * {} = {})",
             what, dim_name[i], k, a.dilation[i], eff, dim_name[i], in, a.padding[i], padded);
    out[2 + i] = (padded - eff) / a.stride[i] + 1;
  }
  return out;
}

void check_same(const Tensor& a, const Tensor& b, const char* what, const char* an, const char* bn) {
  check_same_device(a, b, what);
  AF_CHECK(a.dtype() == b.dtype(), "{}: {} and {} must have the same dtype, got {} and {}", what, an, bn,
           dtype_name(a.dtype()), dtype_name(b.dtype()));
}

}  // namespace

Shape conv2d_output_shape(const Shape& input_shape, const Shape& weight_shape, const Conv2dAttrs& attrs) {
  return conv_check("conv2d", input_shape, weight_shape, attrs);
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dAttrs& attrs) {
  check_defined(x, "conv2d", "input");
  check_defined(w, "conv2d", "weight");
  check_float(x, "conv2d", "input");
  check_same(x, w, "conv2d", "input", "weight");
  const Shape os = conv_check("conv2d", x.shape(), w.shape(), attrs);
  if (bias.defined()) {
    check_same(x, bias, "conv2d", "input", "bias");
    AF_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "conv2d: bias must have shape [{}] (C_out), got {}",
             w.size(0), bias.shape().str());
  }
  const MemoryFormat fmt = conv2d_memory_format(x, w);
  Tensor out = Tensor::empty(os, x.dtype(), x.device(), fmt);
  Tensor xk = to_image_layout(x, fmt);
  if (bias.defined())
    dispatch(OpId::conv2d, x.device(), {xk, w, bias}, {out}, &attrs);
  else
    dispatch(OpId::conv2d, x.device(), {xk, w}, {out}, &attrs);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Shape& input_shape,
                             const Conv2dAttrs& attrs, MemoryFormat format) {
  const char* what = "conv2d_backward_input";
  check_defined(grad_out, what, "grad_output");
  check_defined(w, what, "weight");
  check_float(grad_out, what, "grad_output");
  check_same(grad_out, w, what, "grad_output", "weight");
  const Shape os = conv_check(what, input_shape, w.shape(), attrs);
  AF_CHECK(grad_out.shape() == os, "{}: grad_output must have the forward output's shape {}, got {}", what, os.str(),
           grad_out.shape().str());
  Tensor gin = Tensor::empty(input_shape, grad_out.dtype(), grad_out.device(), grad_format(format, grad_out));
  dispatch(OpId::conv2d_backward_input, grad_out.device(),
           {to_image_layout(grad_out, image_memory_format(grad_out)), w}, {gin}, &attrs);
  return gin;
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dAttrs& attrs) {
  const char* what = "conv2d_backward_weight";
  check_defined(grad_out, what, "grad_output");
  check_defined(x, what, "input");
  check_float(grad_out, what, "grad_output");
  check_same(grad_out, x, what, "grad_output", "input");
  const Shape os = conv_check(what, x.shape(), weight_shape, attrs);
  AF_CHECK(grad_out.shape() == os, "{}: grad_output must have the forward output's shape {}, got {}", what, os.str(),
           grad_out.shape().str());
  Tensor gw = Tensor::empty(weight_shape, x.dtype(), x.device());
  dispatch(OpId::conv2d_backward_weight, x.device(),
           {to_image_layout(grad_out, image_memory_format(grad_out)), to_image_layout(x, image_memory_format(x))}, {gw},
           &attrs);
  return gw;
}

}  // namespace ampforge::ops
