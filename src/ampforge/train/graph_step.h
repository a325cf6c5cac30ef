// A training step (train_step over its micro-batches) captured once as a CUDA graph and replayed for
// every later step of the same shapes: one launch instead of one per operation, which matters for
// launch-bound models (small layers, small batches).
//
// The graph reads its inputs from static tensors and writes its loss into a static output, so each run
// copies the step's batches into the static inputs first (on the compute stream, before the replay).
// The learning rate reaches the captured optimizer kernel through the optimizer's device
// hyperparameters, written before each replay (Optimizer::sync_hyperparams); SGD's momentum has none, so a
// changed momentum (warm-up) makes run() capture the step again. The caller runs a few eager
// steps first (kWarmupSteps): lazily created state (scaler, library handles, cuDNN/cuBLASLt algorithm
// choices, the allocator's segments) must exist before capture.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ampforge/core/runtime.h"
#include "ampforge/train/step.h"

namespace ampforge::tasks {
class Task;
}

namespace ampforge::train {

// Why --cuda-graphs cannot capture a training step of `model` on `task`, or "" when it can: a task whose loss
// reads device values on the host (Task::cuda_graph_obstacle), or a Dropout with p > 0 (a captured step would
// replay the same random mask at every step; backends/cuda/random.cu refuses it inside a capture). The trainer
// asks before training, so the error comes up front, not after the eager warm-up steps.
std::string cuda_graph_obstacle(nn::Module& model, const tasks::Task& task);

class StepGraph {
 public:
  static constexpr int64_t kWarmupSteps = 3;
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether a step over `micro` can use this graph: the same number of micro-batches with the shapes
  // and dtypes of the captured ones (or anything, before the capture).
  bool fits(std::span<const data::Batch> micro) const;
  // Runs one step: copies `micro` into the static inputs, applies `options.schedule` for
  // `options.global_step` and syncs the lr to the device, captures the step at the first call (and anew
  // when the momentum changed), replays it. Returns the step's loss (the graph's static output: read or
  // copy it before the next run).
  // `options.read_loss` must be false (a captured step cannot synchronise).
  Tensor run(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, amp::GradScaler& scaler,
             std::span<const data::Batch> micro, const StepOptions& options);

  bool captured() const { return graph_ != nullptr; }
  int64_t nodes() const { return nodes_; }      // operations in the graph (each a launch when eager)
  int64_t kernels() const { return kernels_; }  // kernel nodes among them
  int64_t replays() const { return replays_; }
  // The captured step's memory, in the graph's private pool (not in the device's caching allocator): reserved
  // bytes and the peak of its live tensors (0 before the capture).
  int64_t pool_reserved_bytes() const;
  int64_t pool_peak_allocated_bytes() const;

 private:
  std::unique_ptr<runtime::Graph> graph_;  // the device's graph (core/runtime.h)
  std::vector<data::Batch> inputs_;  // static inputs, one per micro-batch
  Tensor loss_;
  double momentum_ = -1;  // opt.momentum() at capture (a replay uses that value)
  int64_t nodes_ = 0, kernels_ = 0, replays_ = 0;
};

}  // namespace ampforge::train
