#include "ampforge/train/step.h"

#include <cmath>

#include "ampforge/amp/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/profiler/profiler.h"

namespace ampforge::train {

StepResult train_step(nn::Module& model, optim::Optimizer& opt, amp::GradScaler& scaler, const Tensor& x,
                      const Tensor& y, const StepOptions& o) {
  StepResult r;
  {
    profiler::Range opt_range("optimizer", profiler::RangeKind::Phase);
    if (o.schedule != nullptr) o.schedule->apply(o.global_step);
    opt.zero_grad();
  }
  const bool use_autocast = o.precision != DType::F32;
  Tensor loss;
  {
    profiler::Range fwd_range("forward", profiler::RangeKind::Phase);
    amp::Autocast ac(x.device(), use_autocast ? o.precision : DType::BF16, use_autocast);
    Tensor logits = model(x);
    loss = cross_entropy(logits, y);
  }
  if (o.after_forward) o.after_forward(loss);
  r.loss_tensor = ops::to_dtype(loss.detach(), DType::F32);
  // Device decisions without a scaler: nothing else would notice a non-finite loss, so flag it on the device
  // (amp_unscale_ by 1 of a copy sets found when the value is Inf/NaN) and let the fused optimizer skip itself.
  Tensor found;
  if (o.read_loss) {
    r.loss = [&] {
      profiler::Range sync_range("loss.item", profiler::RangeKind::Sync);
      return r.loss_tensor.item();
    }();
    if (!std::isfinite(r.loss) && !scaler.is_enabled()) return r;  // the caller's NaN policy decides
  } else {
    r.loss = std::nan("");
    if (!scaler.is_enabled()) {
      AF_CHECK(opt.device_hyperparams(), "train_step: read_loss = false needs an optimizer with device "
                                         "hyperparameters (it decides on the device whether to step)");
      autograd::NoGradGuard ng;
      found = ops::zeros({}, DType::F32, loss.device());
      ops::amp_unscale_(ops::mul_scalar(r.loss_tensor, 1.0), ops::ones({}, DType::F32, loss.device()), found);
    }
  }
  {
    profiler::Range bwd_range("backward", profiler::RangeKind::Phase);
    scaler.scale(loss).backward();
  }
  profiler::Range opt_range("optimizer", profiler::RangeKind::Phase);
  r.backward_ran = true;
  if (o.clip_grad_norm > 0) {
    scaler.unscale_(opt);
    if (o.read_loss) optim::clip_grad_norm_(opt, o.clip_grad_norm);
    else optim::clip_grad_norm_on_device_(opt, o.clip_grad_norm);
  }
  if (found.defined()) {
    autograd::NoGradGuard ng;
    opt.step(found);
    r.stepped = true;  // queued: the kernel skips itself when found is set
  } else {
    r.stepped = scaler.step(opt);
  }
  scaler.update();
  return r;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, const std::vector<Tensor>& params) {
  if (cfg.optimizer == "adamw") {
    optim::AdamWOptions o;
    o.lr = cfg.lr;
    if (cfg.weight_decay >= 0) o.weight_decay = cfg.weight_decay;
    o.rounding = {cfg.stochastic_rounding, cfg.seed};
    return std::make_unique<optim::AdamW>(params, o);
  }
  AF_CHECK(cfg.optimizer == "sgd", "--optimizer must be adamw or sgd, got '{}'", cfg.optimizer);
  optim::SGDOptions o;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.nesterov = cfg.nesterov;
  if (cfg.weight_decay >= 0) o.weight_decay = cfg.weight_decay;
  o.rounding = {cfg.stochastic_rounding, cfg.seed};
  return std::make_unique<optim::SGD>(params, o);
}

amp::GradScalerOptions grad_scaler_options(DType precision) {
  amp::GradScalerOptions gso;
  gso.enabled = precision == DType::F16;
  return gso;
}

}  // namespace ampforge::train
