#include "ampforge/train/step.h"

#include <cmath>
#include <optional>

#include "ampforge/amp/autocast.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/profiler/profiler.h"

namespace ampforge::train {

StepResult train_step(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, amp::GradScaler& scaler,
                      std::span<const data::Batch> micro, const StepOptions& o) {
  AF_CHECK(!micro.empty(), "train_step: no batch");
  StepResult r;
  {
    profiler::Range opt_range("optimizer", profiler::RangeKind::Phase);
    if (o.schedule != nullptr) o.schedule->apply(o.global_step);
    opt.zero_grad();
  }
  const bool use_autocast = o.precision != DType::F32;
  const double inv_count = 1.0 / static_cast<double>(micro.size());
  // Device decisions without a scaler: nothing else would notice a non-finite loss, so flag it on the device
  // (amp_unscale_ by 1 of a copy sets found when the value is Inf/NaN) and let the fused optimizer skip itself.
  Tensor found;
  if (!o.read_loss && !scaler.is_enabled()) {
    AF_CHECK(opt.device_hyperparams(), "train_step: read_loss = false needs an optimizer with device "
                                       "hyperparameters (it decides on the device whether to step)");
    found = ops::zeros({}, DType::F32, micro.front().x.device());
  }
  double loss_sum = 0;
  Tensor loss_sum_t;  // F32 on the device
  for (const data::Batch& b : micro) {
    Tensor loss;
    {
      profiler::Range fwd_range("forward", profiler::RangeKind::Phase);
      amp::Autocast ac(b.x.device(), use_autocast ? o.precision : DType::BF16, use_autocast);
      std::optional<autograd::RecomputeGuard> rg;
      if (o.recompute) rg.emplace(true);
      loss = task.loss(model, b);
    }
    AF_CHECK(loss.numel() == 1 && dtype_is_float(loss.dtype()), "task '{}': the loss must be one floating value, got "
             "shape {} {}", task.name(), loss.shape().str(), dtype_name(loss.dtype()));
    if (o.after_forward) o.after_forward(loss);
    Tensor lt = ops::to_dtype(loss.detach(), DType::F32).reshape({});
    if (o.data_parallel != nullptr) lt = o.data_parallel->average(lt);
    if (o.read_loss && lt.device().is_meta()) {
      // The meta device has no values (backends/meta/meta.h): the loss is assumed finite, so the step goes on
      // as it does in the common case; the reported loss is NaN.
      loss_sum = std::nan("");
    } else if (o.read_loss) {
      const double lv = [&] {
        profiler::Range sync_range("loss.item", profiler::RangeKind::Sync);
        return lt.item();
      }();
      loss_sum += lv;
      if (!std::isfinite(lv) && !scaler.is_enabled()) {  // the caller's NaN policy decides
        r.loss = lv;
        r.loss_tensor = lt;
        return r;
      }
    } else if (found.defined()) {
      autograd::NoGradGuard ng;
      ops::amp_unscale_(ops::mul_scalar(lt, 1.0), ops::ones({}, DType::F32, lt.device()), found);
    }
    {
      autograd::NoGradGuard ng;
      loss_sum_t = loss_sum_t.defined() ? ops::add(loss_sum_t, lt) : lt;
    }
    profiler::Range bwd_range("backward", profiler::RangeKind::Phase);
    // The last micro-batch's backward may start the gradients' all-reduce (data parallel's overlap).
    if (o.data_parallel != nullptr && &b == &micro.back()) o.data_parallel->arm();
    Tensor scaled = micro.size() > 1 && !o.sum_micro_batches ? mul(loss, inv_count) : loss;
    scaler.scale(scaled).backward();
  }
  {
    autograd::NoGradGuard ng;
    r.loss_tensor = micro.size() > 1 ? ops::mul_scalar(loss_sum_t, inv_count) : loss_sum_t;
  }
  r.loss = o.read_loss ? loss_sum * inv_count : std::nan("");
  if (o.data_parallel != nullptr) {
    profiler::Range comm_range("all-reduce", profiler::RangeKind::Phase);
    o.data_parallel->reduce_gradients();
  }
  profiler::Range opt_range("optimizer", profiler::RangeKind::Phase);
  r.backward_ran = true;
  if (o.data_parallel != nullptr && scaler.is_enabled()) {
    scaler.unscale_(opt);
    o.data_parallel->combine_found_inf(scaler.found_inf(opt));
  }
  if (o.clip_grad_norm > 0) {
    if (o.data_parallel == nullptr || !scaler.is_enabled()) scaler.unscale_(opt);
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
  if (o.data_parallel != nullptr) o.data_parallel->gather_parameters();  // ZeRO-1: the shards to every rank
  scaler.update();
  return r;
}

amp::GradScalerOptions grad_scaler_options(DType precision) {
  amp::GradScalerOptions gso;
  gso.enabled = precision == DType::F16;
  return gso;
}

}  // namespace ampforge::train
