// Differentiable batch_norm and layer_norm. Both run in F32 under autocast (op list: F32); their backward
// formulas are the fused backward kernels (batch_norm_backward, layer_norm_backward), which produce the
// input, weight and bias gradients in one call. Running statistics are state, not inputs: no gradient.
#include "ampforge/autograd/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"

namespace ampforge {

using autograd::Grads;
using autograd::SavedTensor;
using autograd::needs_grad;
using autograd::record;

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  const BatchNormAttrs at{training, momentum, eps};
  ops::BatchNormResult r = ops::batch_norm(x, w, b, running_mean, running_var, at);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    const SavedTensor X(x), W(w);
    auto node = record("BatchNormBackward", {x, w, b}, {r.out},
                       [at, gx, gw, gb, bias_dtype, X, W, M = SavedTensor(r.save_mean),
                        I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
                         ops::NormGrads d =
                             ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), at, {gx, gw, gb});
                         if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
                         return {d.grad_input, d.grad_weight, d.grad_bias};
                       });
    // Recompute mode: the output is rebuilt from the saved input by the same kernel in training mode, which
    // computes the same batch statistics (fixed-order sums) and so the same values bit for bit; without the
    // running statistics, which the forward already updated.
    if (training)
      autograd::set_recompute(node, [at, X, W, B = SavedTensor(b)](uint32_t) {
        return ops::batch_norm(X.get(), W.get(), B.get(), Tensor(), Tensor(), at).out;
      });
  }
  return r.out;
}

Tensor batch_norm_act(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, NormAct act) {
  if (act == NormAct::None || !ops::batch_norm_fuses_activation(x_in.device())) {
    Tensor y = batch_norm(x_in, weight, bias, running_mean, running_var, training, momentum, eps);
    return act == NormAct::ReLU ? relu(y) : act == NormAct::SiLU ? silu(y) : y;
  }
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::batch_norm, {&x, &w, &b});
  const BatchNormAttrs at{training, momentum, eps, act};
  ops::BatchNormResult r = ops::batch_norm(x, w, b, running_mean, running_var, at);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const DType bias_dtype = b.defined() ? b.dtype() : DType::F32;
    // Saved: what batch_norm's backward keeps, plus the bias (to recompute bn(x)); not the output.
    const SavedTensor X(x), W(w), B(b);
    auto node = record(act == NormAct::ReLU ? "BatchNormReluBackward" : "BatchNormSiluBackward", {x, w, b}, {r.out},
                       [at, gx, gw, gb, bias_dtype, X, W, B, M = SavedTensor(r.save_mean),
                        I = SavedTensor(r.save_invstd)](const Grads& g) -> Grads {
                         ops::NormGrads d = ops::batch_norm_backward(g[0], X.get(), W.get(), M.get(), I.get(), at,
                                                                     {gx, gw, gb}, B.get());
                         if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
                         return {d.grad_input, d.grad_weight, d.grad_bias};
                       });
    // Recompute mode: as batch_norm's (same kernel, same statistics), kept once rebuilt as relu's output is
    // (it is a layer's input: see autograd::set_recompute).
    if (training)
      autograd::set_recompute(
          node, [at, X, W, B](uint32_t) { return ops::batch_norm(X.get(), W.get(), B.get(), Tensor(), Tensor(), at).out; },
          /*keep=*/true);
  }
  return r.out;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  Tensor x = x_in, w = weight, b = bias;
  autograd::autocast_inputs(OpId::layer_norm, {&x, &w, &b});
  ops::LayerNormResult r = ops::layer_norm(x, normalized_shape, w, b, eps);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(), gb = b.defined() && b.requires_grad();
    const int nd = normalized_shape.size();
    const DType bias_dtype = b.defined() ? b.dtype() : x.dtype();
    record("LayerNormBackward", {x, w, b}, {r.out},
           [gx, gw, gb, nd, bias_dtype, X = SavedTensor(x), W = SavedTensor(w), M = SavedTensor(r.mean),
            R = SavedTensor(r.rstd)](const Grads& g) -> Grads {
             ops::NormGrads d = ops::layer_norm_backward(g[0], X.get(), M.get(), R.get(), W.get(), nd, {gx, gw, gb});
             if (d.grad_bias.defined()) d.grad_bias = ops::to_dtype(d.grad_bias, bias_dtype);
             return {d.grad_input, d.grad_weight, d.grad_bias};
           });
  }
  return r.out;
}

}  // namespace ampforge
