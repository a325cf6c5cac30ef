// One optimizer step of training, as the Trainer runs it, for code that needs exactly the trainer's step
// outside its loop (the memory fit finder, `ampforge memory fit`, measures the memory of this very
// function, so that what it reports is what `ampforge train` will use).
//
// A step covers one or more micro-batches (gradient accumulation): the task's loss of each micro-batch is
// divided by their number, so the accumulated gradient is the gradient of the mean loss, as a single
// batch of the combined size would give (exactly so for losses that are means over equal-sized batches).
// With sum_micro_batches the losses are not divided: the gradients of the micro-batches add up, as
// Ultralytics accumulates (its loss is already multiplied by the batch size). The reported loss is the mean
// either way.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/core/dtype.h"
#include "ampforge/core/tensor.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/optim/optimizer.h"
#include "ampforge/tasks/task.h"
#include "ampforge/train/data_parallel.h"

namespace ampforge::train {

struct StepOptions {
  DType precision = DType::F32;             // F16 | BF16: the forward runs under autocast in that dtype
  double clip_grad_norm = 0;                // 0: off
  optim::LRScheduler* schedule = nullptr;   // applied for `global_step` before zero_grad, when set
  int64_t global_step = 0;
  // Called after each micro-batch's forward pass with its loss, before backward (while the saved
  // activations are live).
  std::function<void(const Tensor& loss)> after_forward;
  // false: the loss stays on the device (StepResult::loss_tensor) and every decision is taken there, so
  // the step makes no host synchronisation (the trainer's CUDA mode; also the condition for capturing the
  // step in a CUDA graph). A non-finite loss then cannot stop the step before backward: without a scaler,
  // the optimizer step is skipped on the device instead (found_inf computed from the losses), and gradient
  // clipping keeps its norm on the device. Needs an optimizer with device hyperparameters when a
  // GradScaler is enabled or the loss can be non-finite.
  bool read_loss = true;
  bool sum_micro_batches = false;  // accumulate the micro-batches' gradients without dividing (see above)
  // Data parallel (train/data_parallel.h): each micro-batch's loss is averaged over the ranks before it is
  // looked at (so every rank takes the same non-finite-loss decision), the gradients are averaged after the
  // last micro-batch's backward, and GradScaler's found-inf is combined over the ranks before the step.
  DataParallel* data_parallel = nullptr;
  // Rebuild cheap activations (batch norm, relu, residual sums) in backward instead of keeping them: less
  // activation memory for a few extra elementwise passes, bit-identical gradients (autograd/node.h,
  // RecomputeGuard; docs/MEMORY.md "Activation memory").
  bool recompute = false;
};

struct StepResult {
  double loss = 0;     // mean of the micro-batch losses; NaN with read_loss == false (read loss_tensor)
  Tensor loss_tensor;  // the same mean (F32, one element, detached, on the model's device)
  // False when a loss was not finite and no GradScaler is enabled: the step stopped there, before that
  // micro-batch's backward, and no optimizer step ran (the caller applies its NaN policy). With a scaler,
  // a non-finite gradient skips the step instead.
  bool backward_ran = false;
  bool stepped = false;  // the optimizer updated the parameters (false: skipped for Inf/NaN gradients)
};

// schedule -> zero_grad -> per micro-batch: forward + task loss (autocast for F16/BF16) -> [data parallel:
// loss averaged over the ranks] -> loss.item() (unless read_loss is false) -> scaled backward of
// loss / micro.size() -> [data parallel: gradients averaged over the ranks, in buckets] -> unscale (always
// with data parallel and a scaler, then found-inf combined over the ranks; else only for clipping) ->
// optional gradient clipping -> scaler.step -> scaler.update. `model` must be in training mode and the batches on its
// device; `micro` must not be empty. Profiler ranges: "optimizer", "forward", "loss.item", "backward".
StepResult train_step(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, amp::GradScaler& scaler,
                      std::span<const data::Batch> micro, const StepOptions& options);
// One batch, no accumulation.
inline StepResult train_step(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, amp::GradScaler& scaler,
                             const data::Batch& batch, const StepOptions& options) {
  return train_step(model, task, opt, scaler, std::span<const data::Batch>(&batch, 1), options);
}

// The GradScaler the trainer uses: enabled for F16 only (BF16 has F32's exponent range, as in PyTorch's
// recipes).
amp::GradScalerOptions grad_scaler_options(DType precision);

}  // namespace ampforge::train
