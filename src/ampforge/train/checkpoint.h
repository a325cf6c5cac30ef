// Training checkpoints: one safetensors file holding the model ("model.<name>"), the optimizer state
// ("optim.<name>"), the weight average when the run keeps one ("ema.<name>", train/ema.h) and, in its metadata, the position (epoch, step), the RNG state, the GradScaler state
// and the config. Python's safetensors / PyTorch can read it (scripts/check_checkpoint.py shows how with
// only json + numpy). Writes are atomic (core/safetensors.h): a failed save never damages the old file.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/generator.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/optimizer.h"

namespace ampforge::train {

inline constexpr const char* kCheckpointFormat = checkpoint::kFormat;  // core/checkpoint_format.h

struct CheckpointPosition {
  int64_t epoch = 0;          // epoch to continue in
  int64_t batch_in_epoch = 0;  // batches of that epoch already done
  int64_t global_step = 0;    // optimizer steps done
};

struct CheckpointInfo {
  std::string model;
  // What the model was built with (core/checkpoint_format.h), so that export, predict and detect rebuild it from
  // the file alone; record.model empty: not written (a Trainer used without a recipe), read back from "model".
  checkpoint::ModelRecord record;
  CheckpointPosition pos;
  PhiloxState rng;
  std::map<std::string, double> scaler;  // empty without a scaler
  std::string config_json;
  // The weight average (train/ema.h) as a complete state dict, saved as "ema.<name>" with its update count;
  // empty without one. Export, predict and detect load it instead of "model.*" when it is there.
  nn::NamedTensors ema;
  int64_t ema_updates = 0;
};

// Throws Io naming the path and the reason when a checkpoint could not be written there (missing or
// read-only directory, a directory given as the file); leaves nothing behind. The trainer calls it before
// the first step, so a bad --save fails at once instead of after the run.
void check_checkpoint_path(const std::string& path);

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                     const CheckpointInfo& info);
// The same with the optimizer's state given (data parallel with sharded optimizer state gathers it first).
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& opt,
                     const std::vector<std::pair<std::string, Tensor>>& optimizer_state, const CheckpointInfo& info);
// Loads into model and optimizer; throws Io / InvalidArgument naming the file and the problem (corrupt,
// truncated, not a checkpoint, other model, shape mismatch).
CheckpointInfo load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                               const std::string& expected_model);

}  // namespace ampforge::train
