// ops/: fused optimizer steps over flat buffers (see core/attrs.h for the argument layout).
#include "ampforge/ops/ops.h"

namespace ampforge::ops {

namespace {
void check_flat(const Tensor& t, const Tensor& param, const char* what, const char* arg) {
  AF_CHECK(t.defined() && t.is_contiguous() && t.numel() == param.numel() && t.device() == param.device(),
           "{}: '{}' must be a contiguous buffer of {} elements on {}", what, arg, param.numel(), param.device().str());
}
// found_inf (GradScaler's one F32 flag; undefined without a scaler) is read by the step's kernel: on another
// device, a CUDA kernel would dereference a host pointer (an illegal address that ends the CUDA context).
void check_found_inf(const Tensor& found_inf, const Tensor& param, const char* what) {
  if (!found_inf.defined()) return;
  AF_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::F32 && found_inf.device() == param.device(),
           "{}: found_inf must be one F32 value on {}, got {} {} on {}", what, param.device().str(),
           dtype_name(found_inf.dtype()), found_inf.shape().str(), found_inf.device().str());
}
void check_hyper(const Tensor& hyper, const Tensor& param, const char* what) {
  if (!hyper.defined()) return;
  AF_CHECK(hyper.dtype() == DType::F64 && hyper.numel() == 2 && hyper.is_contiguous() &&
               hyper.device() == param.device(),
           "{}: device hyperparameters must be a contiguous F64 tensor of 2 elements {{completed steps, lr}} on {}, "
           "got {} {} on {}", what, param.device().str(), dtype_name(hyper.dtype()), hyper.shape().str(),
           hyper.device().str());
}
}  // namespace

void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamWAttrs& attrs, const Tensor& found_inf, const Tensor& model_param, const Tensor& hyper) {
  AF_CHECK(param.dtype() == DType::F32, "adamw_step: parameters (or master weights) must be F32, got {}",
           dtype_name(param.dtype()));
  check_flat(grad, param, "adamw_step", "grad");
  check_flat(exp_avg, param, "adamw_step", "exp_avg");
  check_flat(exp_avg_sq, param, "adamw_step", "exp_avg_sq");
  if (model_param.defined()) check_flat(model_param, param, "adamw_step", "model_param");
  std::vector<Tensor> outs{param, exp_avg, exp_avg_sq};
  if (model_param.defined()) outs.push_back(model_param);
  check_hyper(hyper, param, "adamw_step");
  check_found_inf(found_inf, param, "adamw_step");
  std::vector<Tensor> ins{grad, found_inf, hyper};
  dispatch(OpId::adamw_step, param.device(), KernelArgs{ins, outs, &attrs});
  for (auto& t : outs) t.storage()->bump_version();
  if (hyper.defined()) hyper.storage()->bump_version();
}

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const SgdAttrs& attrs,
               const Tensor& found_inf, const Tensor& model_param, const Tensor& hyper) {
  AF_CHECK(param.dtype() == DType::F32, "sgd_step: parameters (or master weights) must be F32, got {}",
           dtype_name(param.dtype()));
  check_flat(grad, param, "sgd_step", "grad");
  if (momentum_buffer.defined()) check_flat(momentum_buffer, param, "sgd_step", "momentum_buffer");
  if (model_param.defined()) check_flat(model_param, param, "sgd_step", "model_param");
  std::vector<Tensor> outs{param, momentum_buffer};
  if (model_param.defined()) outs.push_back(model_param);
  check_hyper(hyper, param, "sgd_step");
  check_found_inf(found_inf, param, "sgd_step");
  std::vector<Tensor> ins{grad, found_inf, hyper};
  dispatch(OpId::sgd_step, param.device(), KernelArgs{ins, outs, &attrs});
  for (auto& t : outs)
    if (t.defined()) t.storage()->bump_version();
  if (hyper.defined()) hyper.storage()->bump_version();
}

}  // namespace ampforge::ops
