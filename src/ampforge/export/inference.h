// A registered model, ready for inference: built by name, weights from a checkpoint (or, explicitly, the random
// initialisation), eval mode, and the signature it is called with. Shared by `ampforge export` and
// `ampforge predict`, so the file and the reference run the same model the same way.
#pragma once

#include <string>

#include "ampforge/export/exporter.h"
#include "ampforge/models/registry.h"

namespace ampforge::onnx_export {

struct InferenceModelOptions {
  // Registry name; empty: the one an ampforge training checkpoint records (core/checkpoint_format.h).
  std::string model;
  // An ampforge checkpoint (model.* tensors, and the record of what the model was built with: model, input
  // channels, classes, image size or sequence length, which the options below override) or a plain state dict.
  std::string checkpoint;
  bool random_init = false;  // required when checkpoint is empty: exporting an untrained model is a choice
  uint64_t seed = 0;         // random_init: the default generator's seed before building
  // 0: the checkpoint's record, else the registry entry's default (models::ModelEntry::defaults).
  int64_t in_channels = 0, num_classes = 0, image_size = 0;
  int64_t seq_len = 0;  // text models (task masked_lm): tokens per sequence; 0: the record's, else 128
  // Text models: what the graph outputs, named as Hugging Face's pipelines / optimum's export tasks.
  // "fill-mask" (default): the MLM head's `logits` (B, T, vocab); "feature-extraction": the encoder's
  // `last_hidden_state` (B, T, hidden), without the head. "" = the model's default.
  std::string task;
};

struct InferenceModel {
  const models::ModelEntry* entry = nullptr;
  models::ModelOptions options;
  nn::ModulePtr model;  // eval mode, F32, CPU
  int64_t seq_len = 128;  // text models
  std::string task;       // text models: "fill-mask" or "feature-extraction"; "" for image models
  int64_t loaded_tensors = 0;
  std::string weights;  // a training checkpoint's "model" or "ema" (weight average) tensors; "" otherwise
};

// Throws InvalidArgument with what to do: no checkpoint and no random_init ("untrained model"), a checkpoint
// saved from another model, names or shapes that do not match (every missing, unexpected and mis-shaped key),
// options the model's task does not take (--seq-len for an image model).
InferenceModel load_inference_model(const InferenceModelOptions& opt);

// The signature of the model's task with batch `batch`: classification and detection take images
// (`images` -> `output0`); BERT takes `input_ids` and `attention_mask` (B, seq_len) I64, as Hugging Face exports
// it, and gives `logits` (B, seq_len, vocab) for fill-mask or `last_hidden_state` (B, seq_len, hidden) for
// feature-extraction; another masked_lm model takes input_ids alone through Module::forward.
Signature signature_for(const InferenceModel& m, int64_t batch);

}  // namespace ampforge::onnx_export
