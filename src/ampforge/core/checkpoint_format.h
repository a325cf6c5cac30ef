// The names of ampforge's training checkpoint format (a safetensors file; train/checkpoint.h writes and resumes
// it): in core so that every room that reads a checkpoint (export/ and the CLI's predict, detect, models --load)
// shares one definition with the writer instead of a copy.
//
// Tensors: "model.<name>" (the model's state dict), "optim.<name>" (optimizer state), "ema.<name>" (the weight
// average, when the run kept one). Metadata (strings): "format" = kFormat, "model" (registry name), "model_record"
// (JSON: what the model was built with; read_model_record), "optimizer", "position", "rng", "scaler", "config"
// (the resolved training config, for people), "ampforge_version", "ema_updates".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::checkpoint {

inline constexpr const char* kFormat = "ampforge-checkpoint-v1";
inline constexpr const char* kModelPrefix = "model.";
inline constexpr const char* kOptimizerPrefix = "optim.";
inline constexpr const char* kEmaPrefix = "ema.";

// What a model was built with, so that a command given only the checkpoint can build it again (export, predict,
// detect, models --load, train --weights/--resume). Zero or empty: not recorded (an older checkpoint).
struct ModelRecord {
  std::string model;  // registry name, e.g. "resnet18"
  std::string task;   // its task: "classification", "masked_lm", "detection"
  int64_t in_channels = 0;
  int64_t num_classes = 0;  // masked LM: the vocabulary size
  int64_t image_size = 0;   // masked LM: the sequence length trained on
};

// True when the metadata says the file is an ampforge training checkpoint.
bool is_checkpoint(const std::map<std::string, std::string>& metadata);
// The record of a checkpoint; std::nullopt for a file that is not an ampforge checkpoint (a plain state dict).
// A checkpoint written before the record existed gives {model} with zeros. Malformed JSON: Io error naming `path`.
std::optional<ModelRecord> read_model_record(const std::map<std::string, std::string>& metadata,
                                             const std::string& path);
// The "model_record" metadata value for `r`.
std::string model_record_json(const ModelRecord& r);

// The weights a checkpoint's tensors hold for inference and fine-tuning, without their prefix: the weight average
// ("ema.*") when the run kept one (what its evaluations measured, and what Ultralytics ships as the model), else
// "model.*". `which` (optional) receives "ema" or "model".
std::vector<std::pair<std::string, Tensor>> model_weights(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                          std::string* which = nullptr);

}  // namespace ampforge::checkpoint
