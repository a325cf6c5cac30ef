// A registered model, ready for inference: built by name, weights from a checkpoint (or, explicitly, the random
// initialisation), eval mode, and the signature it is called with. Shared by `ampforge export` and
// `ampforge predict`, so the file and the reference run the same model the same way.
#pragma once

#include <string>

#include "ampforge/export/exporter.h"
#include "ampforge/models/registry.h"

namespace ampforge::onnx_export {

struct InferenceModelOptions {
  std::string model;       // registry name
  std::string checkpoint;  // an ampforge checkpoint (model.* tensors) or a plain state dict (safetensors)
  bool random_init = false;  // required when checkpoint is empty: exporting an untrained model is a choice
  uint64_t seed = 0;         // random_init: the default generator's seed before building
  // 0: the registry entry's default (models::ModelEntry::defaults).
  int64_t in_channels = 0, num_classes = 0, image_size = 0;
  int64_t seq_len = 0;  // text models (task masked_lm): tokens per sequence; 0: 128
};

struct InferenceModel {
  const models::ModelEntry* entry = nullptr;
  models::ModelOptions options;
  nn::ModulePtr model;  // eval mode, F32, CPU
  int64_t seq_len = 128;  // text models
  int64_t loaded_tensors = 0;
};

// Throws InvalidArgument with what to do: no checkpoint and no random_init ("untrained model"), a checkpoint
// saved from another model, names or shapes that do not match (every missing, unexpected and mis-shaped key),
// options the model's task does not take (--seq-len for an image model).
InferenceModel load_inference_model(const InferenceModelOptions& opt);

// The signature of the model's task with batch `batch`: classification and detection take images;
// masked_lm takes input_ids (B, seq_len) I64 -> logits (B, seq_len, vocab) through Module::forward (BERT's
// forward(input_ids): every position attended; an attention_mask input needs the model's two-input call,
// which this signature does not know yet).
Signature signature_for(const InferenceModel& m, int64_t batch);

}  // namespace ampforge::onnx_export
