// ops/: batch_norm and layer_norm (forward and backward): validation, layout, output allocation, dispatch.
// The CPU kernels read batch_norm operands as contiguous (N, C, *) or channels-last (N, H, W, C); anything
// else is copied into one of those first (channels-last when x suggests it).
#include "ampforge/core/runtime.h"
#include "ampforge/ops/ops.h"

namespace ampforge::ops {
namespace {

DType stat_dtype(DType x) { return x == DType::F64 ? DType::F64 : DType::F32; }

MemoryFormat bn_format(const Tensor& x) {
  if (x.is_contiguous()) return MemoryFormat::Contiguous;
  if (x.dim() == 4 && x.is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  return x.suggest_memory_format();
}

void check_channel_vector(const Tensor& t, const Tensor& x, int64_t C, const char* arg) {
  if (!t.defined()) return;
  check_same_device(t, x, "batch_norm");
  AF_CHECK(t.is_floating_point(), "batch_norm: {} must be a floating-point tensor, got {}", arg,
           dtype_name(t.dtype()));
  AF_CHECK(t.dim() == 1 && t.size(0) == C,
           "batch_norm: {} must have shape [{}] (one value per channel of input {}), got {}", arg, C,
           x.shape().str(), t.shape().str());
}

}  // namespace

BatchNormResult batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, const BatchNormAttrs& attrs, const Tensor& residual) {
  check_defined(x_in, "batch_norm", "input");
  check_float(x_in, "batch_norm", "input");
  AF_CHECK(x_in.dim() >= 2, "batch_norm: expected input of shape (N, C) or (N, C, *), got {}", x_in.shape().str());
  const int64_t C = x_in.size(1);
  check_channel_vector(weight, x_in, C, "weight");
  check_channel_vector(bias, x_in, C, "bias");
  check_channel_vector(running_mean, x_in, C, "running_mean");
  check_channel_vector(running_var, x_in, C, "running_var");
  AF_CHECK(running_mean.defined() == running_var.defined(),
           "batch_norm: running_mean and running_var must both be given or both be undefined (got only {})",
           running_mean.defined() ? "running_mean" : "running_var");
  AF_CHECK(attrs.training || running_mean.defined(),
           "batch_norm: running_mean and running_var are required when training is false");
  AF_CHECK(attrs.eps >= 0, "batch_norm: eps must be >= 0, got {}", attrs.eps);
  AF_CHECK(attrs.act == NormAct::None || batch_norm_fuses_activation(x_in.device()),
           "batch_norm: a fused activation runs on the CPU only, not on {} (use batch_norm_act in autograd/functions.h, "
           "which composes it elsewhere)", x_in.device().str());
  const int64_t per_channel = C == 0 ? 0 : x_in.numel() / C;
  AF_CHECK(!attrs.training || per_channel > 1,
           "batch_norm: expected more than 1 value per channel when training, got input shape {}",
           x_in.shape().str());
  if (residual.defined()) {
    AF_CHECK(batch_norm_fuses_activation(x_in.device()),
             "batch_norm: a fused residual runs on the CPU only, not on {} (use batch_norm_add_act in "
             "autograd/functions.h, which composes it elsewhere)", x_in.device().str());
    AF_CHECK(norm_act_takes_residual(attrs.act), "batch_norm: a fused residual takes no activation or ReLU");
    check_same_device(residual, x_in, "batch_norm");
    AF_CHECK(residual.shape() == x_in.shape() && residual.dtype() == x_in.dtype(),
             "batch_norm: residual {} {} must have the input's shape and dtype ({} {})", residual.shape().str(),
             dtype_name(residual.dtype()), x_in.shape().str(), dtype_name(x_in.dtype()));
  }
  const MemoryFormat fmt = bn_format(x_in);
  Tensor x = contiguous(x_in, fmt);
  const Tensor res = residual.defined() ? contiguous(residual, fmt) : Tensor();
  BatchNormResult r;
  r.out = Tensor::empty(x.shape(), x.dtype(), x.device(), fmt);
  r.save_mean = Tensor::empty({C}, stat_dtype(x.dtype()), x.device());
  r.save_invstd = Tensor::empty({C}, stat_dtype(x.dtype()), x.device());
  dispatch(OpId::batch_norm, x.device(), {x, weight, bias, running_mean, running_var, res},
           {r.out, r.save_mean, r.save_invstd}, &attrs);
  if (attrs.training && running_mean.defined()) {
    running_mean.storage()->bump_version();
    running_var.storage()->bump_version();
  }
  return r;
}

bool batch_norm_fuses_activation(Device device) {
  return runtime::has_capability(device, runtime::Capability::FusedBatchNormActivation);
}

NormGrads batch_norm_backward(const Tensor& grad, const Tensor& x_in, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, const BatchNormAttrs& attrs, std::array<bool, 3> want,
                              const Tensor& bias, const Tensor& out) {
  check_defined(grad, "batch_norm_backward", "grad");
  check_defined(x_in, "batch_norm_backward", "input");
  AF_CHECK(grad.shape() == x_in.shape(), "batch_norm_backward: grad shape {} differs from the input shape {}",
           grad.shape().str(), x_in.shape().str());
  check_same_device(grad, x_in, "batch_norm_backward");
  AF_CHECK(attrs.act == NormAct::None || batch_norm_fuses_activation(x_in.device()),
           "batch_norm_backward: a fused activation runs on the CPU only, not on {}", x_in.device().str());
  if (out.defined()) {
    AF_CHECK(batch_norm_fuses_activation(x_in.device()) && norm_act_takes_residual(attrs.act),
             "batch_norm_backward: the residual form runs on the CPU with no activation or ReLU");
    AF_CHECK(out.shape() == x_in.shape(), "batch_norm_backward: output shape {} differs from the input shape {}",
             out.shape().str(), x_in.shape().str());
  }
  const MemoryFormat fmt = bn_format(x_in);
  Tensor x = contiguous(x_in, fmt);
  Tensor g = contiguous(to_dtype(grad, x.dtype()), fmt);
  const Tensor y = out.defined() ? contiguous(to_dtype(out, x.dtype()), fmt) : Tensor();
  NormGrads r;
  if (want[0]) r.grad_input = Tensor::empty(x.shape(), x.dtype(), x.device(), fmt);
  if (out.defined()) r.grad_residual = Tensor::empty(x.shape(), x.dtype(), x.device(), fmt);
  const int64_t C = x.size(1);
  // Parameter gradients take the weight's dtype; without a weight (bias only) the statistics' dtype.
  const DType pdt = weight.defined() ? weight.dtype() : stat_dtype(x.dtype());
  if (want[1] && weight.defined()) r.grad_weight = Tensor::empty({C}, pdt, x.device());
  if (want[2]) r.grad_bias = Tensor::empty({C}, pdt, x.device());
  dispatch(OpId::batch_norm_backward, x.device(), {g, x, weight, save_mean, save_invstd, bias, y},
           {r.grad_input, r.grad_weight, r.grad_bias, r.grad_residual}, &attrs);
  return r;
}

LayerNormResult layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                           double eps) {
  check_defined(x_in, "layer_norm", "input");
  check_float(x_in, "layer_norm", "input");
  const int nd = normalized_shape.size();
  AF_CHECK(nd >= 1, "layer_norm: normalized_shape must have at least one dimension");
  bool match = x_in.dim() >= nd;
  for (int i = 0; match && i < nd; ++i) match = x_in.size(x_in.dim() - nd + i) == normalized_shape[i];
  AF_CHECK(match, "layer_norm: normalized_shape {} does not match the trailing dims of input {}",
           normalized_shape.str(), x_in.shape().str());
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* arg = p == &weight ? "weight" : "bias";
    check_same_device(*p, x_in, "layer_norm");
    AF_CHECK(p->is_floating_point(), "layer_norm: {} must be a floating-point tensor, got {}", arg,
             dtype_name(p->dtype()));
    AF_CHECK(p->shape() == normalized_shape, "layer_norm: {} must have shape normalized_shape = {}, got {}", arg,
             normalized_shape.str(), p->shape().str());
  }
  AF_CHECK(eps >= 0, "layer_norm: eps must be >= 0, got {}", eps);
  Tensor x = contiguous(x_in);
  Tensor w = weight.defined() ? contiguous(weight) : weight;
  Tensor b = bias.defined() ? contiguous(bias) : bias;
  Shape stat_shape = x.shape();
  for (int i = x.dim() - nd; i < x.dim(); ++i) stat_shape[i] = 1;
  LayerNormResult r;
  r.out = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.mean = Tensor::empty(stat_shape, stat_dtype(x.dtype()), x.device());
  r.rstd = Tensor::empty(stat_shape, stat_dtype(x.dtype()), x.device());
  LayerNormAttrs at{nd, eps};
  dispatch(OpId::layer_norm, x.device(), {x, w, b}, {r.out, r.mean, r.rstd}, &at);
  return r;
}

NormGrads layer_norm_backward(const Tensor& grad, const Tensor& x_in, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, int normalized_dims, std::array<bool, 3> want) {
  check_defined(grad, "layer_norm_backward", "grad");
  AF_CHECK(grad.shape() == x_in.shape(), "layer_norm_backward: grad shape {} differs from the input shape {}",
           grad.shape().str(), x_in.shape().str());
  check_same_device(grad, x_in, "layer_norm_backward");
  Tensor x = contiguous(x_in);
  Tensor g = contiguous(to_dtype(grad, x.dtype()));
  Tensor w = weight.defined() ? contiguous(weight) : weight;
  NormGrads r;
  if (want[0]) r.grad_input = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (want[1] && w.defined()) r.grad_weight = Tensor::empty(w.shape(), w.dtype(), w.device());
  if (want[2]) {
    Shape ns;
    for (int i = x.dim() - normalized_dims; i < x.dim(); ++i) ns.push_back(x.size(i));
    r.grad_bias = Tensor::empty(ns, w.defined() ? w.dtype() : x.dtype(), x.device());
  }
  LayerNormAttrs at{normalized_dims, 0.0};
  dispatch(OpId::layer_norm_backward, x.device(), {g, x, mean, rstd, w}, {r.grad_input, r.grad_weight, r.grad_bias},
           &at);
  return r;
}

}  // namespace ampforge::ops
