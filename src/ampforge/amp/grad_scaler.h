// amp::GradScaler: dynamic loss scaling with PyTorch's semantics and defaults (torch.cuda.amp.GradScaler):
// init_scale 65536, growth_factor 2, backoff_factor 0.5, growth_interval 2000.
//
//   Tensor loss = ...;                  // computed under amp::Autocast
//   scaler.scale(loss).backward();      // gradients are scaled
//   scaler.unscale_(opt);               // optional (e.g. before clipping); once per step
//   scaler.step(opt);                   // unscales if needed; skips the step if any grad is Inf/NaN
//   scaler.update();                    // backoff on overflow, growth after growth_interval clean steps
//
// The scale, the growth tracker and found_inf are one-element tensors on the model's device; unscaling
// and the Inf/NaN check are one fused pass over each flat gradient buffer, and the scale update is a
// kernel. With an optimizer in host mode (the CPU default) step() reads found_inf once to decide; with
// an optimizer that keeps its hyperparameters on the device (optim::Optimizer::device_hyperparams(), the
// CUDA default) step() reads nothing: the fused kernel skips itself, and the skip is counted on the device.
// A CUDA training step with GradScaler then needs no host synchronisation at all.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/optim/optimizer.h"

namespace ampforge::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions opt = {});

  // loss * scale (differentiable). Pass-through when disabled.
  Tensor scale(const Tensor& loss);
  // Divides the optimizer's gradients by the scale in place and records Inf/NaN. Calling it twice for
  // the same optimizer before update(), or after step(), is an error (as in PyTorch).
  void unscale_(optim::Optimizer& opt);
  // Unscales (if not done yet) and steps the optimizer unless a gradient was Inf/NaN. Returns whether
  // the optimizer stepped; when the decision stays on the device (device hyperparameters), returns true
  // ("queued": the kernel skips itself) and skipped_steps() tells afterwards.
  bool step(optim::Optimizer& opt);
  // This iteration's Inf/NaN flag for `opt` (one-element F32 tensor on the device, non-zero: found), set by
  // unscale_() and read by step(); undefined before unscale_(). Code that must combine it with other
  // processes' flags before step() decides changes it in place (data parallel: every rank must skip the
  // same steps, train/data_parallel.h).
  Tensor found_inf(const optim::Optimizer& opt) const;
  // Updates the scale from this iteration's found-inf results, or sets it to new_scale.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const;  // 1.0 when disabled (reads the device value)
  bool is_enabled() const { return opt_.enabled; }
  int64_t growth_tracker() const;
  const GradScalerOptions& options() const { return opt_; }
  // Counters for reports: optimizer steps skipped because of Inf/NaN (reads the device count when there is
  // one: a synchronisation).
  int64_t skipped_steps() const;

  // PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker, plus
  // "version". Loading checks every key and the version.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    Tensor found_inf;
  };
  void lazy_init(Device device);

  GradScalerOptions opt_;
  Tensor scale_;           // F32, one element, on the device of the first scaled loss
  Tensor growth_tracker_;  // I32, one element
  std::map<uint64_t, PerOptimizer> per_opt_;
  int64_t skipped_ = 0;
  int64_t init_growth_tracker_ = 0;  // from load_state_dict before the state exists
  Tensor skipped_dev_;  // F32, one element: skips decided on the device
};

}  // namespace ampforge::amp
