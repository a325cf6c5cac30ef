// One training step, as the Trainer runs it, for code that needs exactly the trainer's step outside its
// loop (the memory fit finder, `ampforge memory fit`, measures the memory of this very function, so that
// what it reports is what `ampforge train` will use). Also the trainer's optimizer construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/core/dtype.h"
#include "ampforge/core/tensor.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/optim/optimizer.h"
#include "ampforge/train/trainer.h"

namespace ampforge::train {

struct StepOptions {
  DType precision = DType::F32;             // F16 | BF16: the forward runs under autocast in that dtype
  double clip_grad_norm = 0;                // 0: off
  optim::LRScheduler* schedule = nullptr;   // applied for `global_step` before zero_grad, when set
  int64_t global_step = 0;
  // Called after the forward pass with the loss, before backward (while the saved activations are live).
  std::function<void(const Tensor& loss)> after_forward;
  // false: the loss stays on the device (StepResult::loss_tensor) and every decision is taken there, so
  // the step makes no host synchronisation (the trainer's CUDA mode; also the condition for capturing the
  // step in a CUDA graph). A non-finite loss then cannot stop the step before backward: without a scaler,
  // the optimizer step is skipped on the device instead (found_inf computed from the loss), and gradient
  // clipping keeps its norm on the device. Needs an optimizer with device hyperparameters when a
  // GradScaler is enabled or the loss can be non-finite.
  bool read_loss = true;
};

struct StepResult {
  double loss = 0;     // NaN with read_loss == false (read loss_tensor when needed)
  Tensor loss_tensor;  // the loss (F32, one element, detached, on the model's device)
  // False when the loss was not finite and no GradScaler is enabled: no backward and no optimizer step ran
  // (the caller applies its NaN policy). With a scaler, a non-finite gradient skips the step instead.
  bool backward_ran = false;
  bool stepped = false;  // the optimizer updated the parameters (false: skipped for Inf/NaN gradients)
};

// schedule -> zero_grad -> forward (autocast for F16/BF16) -> cross-entropy loss -> loss.item() (unless
// read_loss is false) -> scaled backward -> optional unscale + gradient clipping -> scaler.step -> scaler.update.
// `model` must be in training mode. Profiler ranges: "optimizer", "forward", "loss.item", "backward".
StepResult train_step(nn::Module& model, optim::Optimizer& opt, amp::GradScaler& scaler, const Tensor& x,
                      const Tensor& y, const StepOptions& options);

// The optimizer `ampforge train` builds from its config (AdamW or SGD: lr, weight decay, momentum, rounding).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, const std::vector<Tensor>& params);

// The GradScaler the trainer uses: enabled for F16 only (BF16 has F32's exponent range, as in PyTorch's
// recipes).
amp::GradScalerOptions grad_scaler_options(DType precision);

}  // namespace ampforge::train
