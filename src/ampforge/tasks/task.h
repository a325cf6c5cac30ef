// Task: what the training loop trains for. A task turns a batch into a loss (training) and into metrics
// (evaluation); the loop (train/trainer.h) knows no task and no model by name, so a new model or task
// never edits the loop. The kinds of task are registered by name in tasks/registry.h.
//
// Contract shared by every task:
//  - `loss` is called in training mode, inside the loop's autocast region, with the batch already on the
//    model's device. It returns a one-element floating tensor connected to the parameters. It must not
//    read values back to the host: on CUDA the loop keeps a step free of host synchronisations and may
//    capture it in a CUDA graph (so the same shapes must issue the same operations every call).
//  - An Evaluator is made per evaluation. `add` is called in eval mode under no-grad and the loop's
//    autocast; it keeps its sums as tensors on the batch's device. `result` reads them once.
//  - `details` (optional) is asked after `result`: what an evaluation has beyond its scalar metrics (detection's
//    per-class table). The loop keeps the last evaluation's in TrainResult; `ampforge train` prints the text on
//    stderr and adds the JSON object's members to its --json summary, without knowing the task.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/device.h"
#include "ampforge/core/tensor.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/nn/module.h"

namespace ampforge::tasks {

struct Metric {
  std::string name;      // snake_case: "loss", "accuracy", "top5_accuracy"
  double value = 0;
  bool fraction = false;  // a ratio in [0, 1], shown as a percentage by people-facing output
};
using Metrics = std::vector<Metric>;

// The value of metric `name`, or NaN when absent.
inline double metric_value(const Metrics& m, const std::string& name) {
  for (const Metric& x : m)
    if (x.name == name) return x.value;
  return std::nan("");
}

// An evaluation's details for people and programs; both empty when the task has none.
struct EvalDetails {
  std::string json;  // a JSON object (text) whose members go into `ampforge train --json`'s summary
  std::string text;  // a table for people, printed after training
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual void add(nn::Module& model, const data::Batch& batch) = 0;
  virtual Metrics result() = 0;
  virtual EvalDetails details() { return {}; }  // called after result()
};

// What a task's models take: images (B, C, S, S) F32 (ModelOptions::image_size is the side), or token ids
// (B, T) as F32 values (ModelOptions::image_size is the sequence length, num_classes the vocabulary).
enum class InputKind { Images, TokenIds };

struct SyntheticBatchOptions {
  int64_t batch = 8;
  int64_t seq_len = 128;       // token-id tasks
  uint64_t seed = 0;
  Device device = kCPU;        // the batch is made here (values drawn on the CPU; none on the meta device)
  bool channels_last = true;   // images in channels-last layout (what the data loader delivers)
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual Tensor loss(nn::Module& model, const data::Batch& batch) = 0;
  virtual std::unique_ptr<Evaluator> evaluator() const = 0;
  // The evaluation metric that summarises a run (e.g. "accuracy"); must be one that result() reports.
  virtual std::string primary_metric() const = 0;
  // Why a training step's loss cannot be captured in a CUDA graph (it reads device values on the host, which
  // a capture cannot do), or "" when it can. --cuda-graphs refuses such a task before training starts.
  virtual std::string cuda_graph_obstacle() const { return {}; }
  // Why `model` cannot be trained for this task (it lacks the task's model interface, models/task_models.h), or ""
  // when it can. The Trainer asks before training starts.
  virtual std::string model_mismatch(nn::Module& /*model*/) const { return {}; }
};

}  // namespace ampforge::tasks
