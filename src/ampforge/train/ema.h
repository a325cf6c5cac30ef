// An exponential moving average of a model's weights, as Ultralytics' ModelEMA keeps it (and timm's ModelEmaV2):
// after every optimizer step that updated the parameters, each floating-point entry of the state dict
// (parameters and buffers, e.g. BatchNorm's running statistics) moves towards the model's value,
//     ema = d * ema + (1 - d) * model,   d = decay * (1 - exp(-updates / tau))
// where `updates` counts the updates including this one. The ramp keeps the average close to the fast-moving
// early weights (d is 0.39 * decay after 1000 updates with tau 2000); tau = 0 means a constant d = decay.
// Evaluation runs on the averaged weights (apply_to), checkpoints keep them ("ema.<name>"), and export, predict
// and detect use them when a checkpoint has them, as Ultralytics ships its EMA as the model.
//
// Storage: F32 copies on the model's device, whatever the model's dtype (a 16-bit master-weight model keeps an
// F32 average, so that small moves are not lost to rounding). Integer entries (e.g. num_batches_tracked) are not
// averaged: the model's own values stay in place. Not thread-safe; call from the training thread.
#pragma once

#include <cstdint>
#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/nn/module.h"

namespace ampforge::train {

struct EmaOptions {
  bool enabled = false;
  double decay = 0.9999;  // Ultralytics' default
  double tau = 2000;      // ramp (updates); 0: no ramp
};

class ModelEma {
 public:
  // Starts from the model's current floating-point state (a copy).
  ModelEma(const nn::Module& model, EmaOptions options);

  // One update from the model's current state (after an optimizer step that was not skipped).
  void update(const nn::Module& model);
  // d for update number `n` (1-based), as above.
  double decay_at(int64_t n) const;
  int64_t updates() const { return updates_; }

  // The averaged entries under the model's state-dict names (F32).
  const nn::NamedTensors& state() const { return state_; }
  // A complete state dict of `model` with the averaged values: its floating-point entries from the average (in
  // their own dtypes), the others (integer counters) from the model. What checkpoints save as "ema.*", so that
  // the average loads like any state dict.
  nn::NamedTensors full_state_dict(const nn::Module& model) const;
  // Restores a saved average: every floating-point entry of the model must be there by name with its shape
  // (InvalidArgument naming the first that is not); other entries (a full state dict's integers) are ignored.
  void load(const nn::NamedTensors& state, int64_t updates);

  // While alive, the model's floating-point entries hold the averaged values (converted to their dtypes); the
  // model's own values come back when it ends. For evaluation.
  class Applied {
   public:
    Applied(const Applied&) = delete;
    Applied& operator=(const Applied&) = delete;
    Applied(Applied&&) = default;
    ~Applied();

   private:
    friend class ModelEma;
    Applied(std::vector<Tensor> targets, std::vector<Tensor> saved) : targets_(std::move(targets)), saved_(std::move(saved)) {}
    std::vector<Tensor> targets_, saved_;
  };
  Applied apply_to(const nn::Module& model) const;

 private:
  // The model's floating-point state-dict entries, in state-dict order (the ones averaged).
  static nn::NamedTensors float_entries(const nn::Module& model);

  EmaOptions o_;
  nn::NamedTensors state_;
  int64_t updates_ = 0;
};

}  // namespace ampforge::train
