// Typed model interfaces, one per task that needs more of its model than nn::Module::forward. A task
// (tasks/) programs against the interface, not a concrete model: any model that implements it trains, is
// evaluated and is exported through that task (a user's own masked language model or detector included).
// Classification needs none: forward(x) -> (B, classes) logits.
//
// model_as<I>(model, task) is the one checked conversion from an nn::Module: the Trainer asks it once, before
// training (tasks::Task::model_mismatch), so a model of the wrong kind is refused with a message naming the
// task and the interface instead of failing inside a step.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ampforge/core/tensor.h"
#include "ampforge/nn/module.h"
#include "ampforge/util/error.h"

namespace ampforge::models {

// A masked language model (BERT-like). Token ids are (B, T) I64 (or floats holding ids); attention_mask (B, T),
// nonzero where a token is kept (undefined: every token); labels (B, T) I64 with -100 where nothing is predicted.
class MaskedLanguageModel : public nn::Module {
 public:
  using nn::Module::Module;  // the concrete model's type name
  // Prediction scores: every position (B, T, V) with positions undefined; positions (M) I64 indices into the
  // flattened (B * T) tokens: (M, V), the head evaluated at those rows only.
  virtual Tensor logits(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                        const Tensor& positions = Tensor(), const Tensor& token_type_ids = Tensor()) = 0;
  // Mean cross-entropy over the tokens whose label is not -100. meta_rows: on the meta device (no values), how
  // many tokens are masked.
  virtual Tensor mlm_loss(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& labels,
                          int64_t meta_rows = -1) = 0;
  // The encoder's last hidden state (B, T, H) (ONNX export's feature-extraction head).
  virtual Tensor encode(const Tensor& input_ids, const Tensor& attention_mask = Tensor()) = 0;
  virtual int64_t vocab_size() const = 0;
};

// A dense one-stage detector with YOLOv8's head layout: per anchor point 4 x reg_max box-distribution logits and
// one logit per class, at strides 8/16/32.
class Detector : public nn::Module {
 public:
  using nn::Module::Module;
  // (B, 4 * reg_max + nc, A) raw outputs of every level, flattened and concatenated, whatever the mode.
  virtual Tensor forward_raw(const Tensor& x) = 0;
  // The eval-mode output of raw outputs whose levels have `sizes`: (B, 4 + nc, A), boxes (cx, cy, w, h) in pixels
  // and class probabilities.
  virtual Tensor decode(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes) = 0;
  // The level sizes (H_i, W_i) for an input of h x w.
  virtual std::vector<std::pair<int64_t, int64_t>> level_sizes(int64_t h, int64_t w) const = 0;
  virtual const std::vector<double>& strides() const = 0;
  virtual int64_t num_classes() const = 0;
};

// The name of interface I for messages.
template <class I>
constexpr const char* interface_name() {
  if constexpr (std::is_same_v<I, MaskedLanguageModel>) return "models::MaskedLanguageModel";
  else if constexpr (std::is_same_v<I, Detector>) return "models::Detector";
  else return "the task's model interface";
}

// The model as interface I, or null when it does not implement it.
template <class I>
I* model_as_or_null(nn::Module& model) {
  return dynamic_cast<I*>(&model);
}

// Why `model` is not an I for `task` (a message naming the task, the interface and the model's type), or "".
template <class I>
std::string interface_mismatch(nn::Module& model, const std::string& task) {
  if (model_as_or_null<I>(model) != nullptr) return {};
  return task + ": the model must implement " + interface_name<I>() + " (models/task_models.h; e.g. " +
         (std::is_same_v<I, Detector> ? "yolov8n" : "bert-base") + "), got " + model.type_name();
}

// The model as interface I; throws InvalidArgument (interface_mismatch's message) otherwise.
template <class I>
I& model_as(nn::Module& model, const std::string& task) {
  I* m = model_as_or_null<I>(model);
  if (m == nullptr) AF_THROW(InvalidArgument, "{}", interface_mismatch<I>(model, task));
  return *m;
}

}  // namespace ampforge::models
