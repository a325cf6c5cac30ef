// Differentiable conv2d, pooling and nearest upsampling. Backward formulas call the ops/ backward kernels
// (conv2d_backward_input / _weight, *_pool2d_backward, upsample_nearest2d_backward) and ops::sum for the
// bias, so they run on every backend that registers those ops.
#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using autograd::SavedTensor;

namespace {

// The bias gradient: gy (N, C, OH, OW) summed over N, OH, OW. Written as sums over the outermost dim of
// views (channels-last: (N*OH*OW, C); NCHW: (N, C, OH*OW) then (C, OH*OW)), which the CPU reduce kernel
// runs fastest: at (128, 32, 28, 28) F32, sum over {0, 2, 3} took 60-150 ms, these 2-3 ms. 16-bit NCHW
// keeps the one-pass sum so that the partial sums are not rounded to 16 bits.
Tensor conv_bias_grad(const Tensor& gy) {
  const int64_t N = gy.size(0), C = gy.size(1), P = gy.size(2) * gy.size(3);
  if (gy.is_contiguous(MemoryFormat::ChannelsLast))
    return ops::sum(ops::reshape(ops::permute(gy, {0, 2, 3, 1}), {N * P, C}), {0});
  if (gy.is_contiguous() && (gy.dtype() == DType::F32 || gy.dtype() == DType::F64))
    return ops::sum(ops::sum(ops::reshape(gy, {N, C, P}), {0}), {1});
  return ops::sum(gy, {0, 2, 3});
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Conv2dAttrs& attrs) {
  Tensor x = x_in, w = w_in, b = b_in;
  autograd::autocast_inputs(OpId::conv2d, {&x, &w, &b});
  Tensor out = ops::conv2d(x, w, b, attrs);
  if (!needs_grad({&x, &w, &b})) return out;
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  // Only what each gradient needs is saved: x for the weight gradient, the weight for the input gradient.
  // The input gradient takes the layout the forward chose for the output (x's, or the weight's).
  record("Conv2dBackward", {x, w, b}, {out},
         [gx, gw, gb, attrs, fmt = ops::conv2d_memory_format(x, w), xs = x.shape(), ws = w.shape(),
          X = SavedTensor(gw ? x : Tensor()), W = SavedTensor(gx ? w : Tensor())](const Grads& g) -> Grads {
           // The output gradient in the output's layout, once for the three gradients: a strided one (YOLOv8's head
           // hands back slices of its (B, no, A) gradient) would otherwise be copied by each backward op, to the
           // layout its strides suggest (NCHW there), against a channels-last input (mixed layouts: no fast kernel).
           const Tensor gy = g[0].dim() == 4 ? ops::to_image_layout(g[0], fmt) : g[0];
           Tensor gX, gW, gB;
           if (gx) gX = ops::conv2d_backward_input(gy, W.get(), xs, attrs, fmt);
           if (gw) gW = ops::conv2d_backward_weight(gy, X.get(), ws, attrs);
           if (gb) gB = conv_bias_grad(gy);
           return {gX, gW, gB};
         });
  return out;
}

Tensor max_pool2d(const Tensor& x_in, const Pool2dAttrs& attrs) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::max_pool2d, {&x});
  auto [out, indices] = ops::max_pool2d(x, attrs);
  if (!needs_grad({&x})) return out;
  record("MaxPool2dBackward", {x}, {out},
         [attrs, xs = x.shape(), fmt = ops::image_memory_format(x), I = SavedTensor(indices)](const Grads& g) -> Grads {
           return {ops::max_pool2d_backward(g[0], I.get(), xs, attrs, fmt)};
         });
  return out;
}

Tensor avg_pool2d(const Tensor& x_in, const Pool2dAttrs& attrs) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::avg_pool2d, {&x});
  Tensor out = ops::avg_pool2d(x, attrs);
  if (!needs_grad({&x})) return out;
  record("AvgPool2dBackward", {x}, {out},
         [attrs, xs = x.shape(), fmt = ops::image_memory_format(x)](const Grads& g) -> Grads {
           return {ops::avg_pool2d_backward(g[0], xs, attrs, fmt)};
         });
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, int64_t out_h, int64_t out_w) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::adaptive_avg_pool2d, {&x});
  Tensor out = ops::adaptive_avg_pool2d(x, out_h, out_w);
  if (!needs_grad({&x})) return out;
  record("AdaptiveAvgPool2dBackward", {x}, {out},
         [xs = x.shape(), fmt = ops::image_memory_format(x)](const Grads& g) -> Grads {
           return {ops::adaptive_avg_pool2d_backward(g[0], xs, fmt)};
         });
  return out;
}

Tensor upsample_nearest2d(const Tensor& x_in, int64_t scale_h, int64_t scale_w) {
  Tensor x = x_in;
  autograd::autocast_inputs(OpId::upsample_nearest2d, {&x});
  Tensor out = ops::upsample_nearest2d(x, scale_h, scale_w);
  if (!needs_grad({&x})) return out;
  record("UpsampleNearest2dBackward", {x}, {out},
         [scale_h, scale_w, xs = x.shape(), fmt = ops::image_memory_format(x)](const Grads& g) -> Grads {
           return {ops::upsample_nearest2d_backward(g[0], xs, scale_h, scale_w, fmt)};
         });
  return out;
}

}  // namespace ampforge
