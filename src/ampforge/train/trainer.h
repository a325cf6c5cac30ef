// Trainer: the training loop. It takes objects — a model (nn::Module), a task (how a batch becomes a loss
// and metrics: tasks/task.h), training and evaluation datasets, an optimizer factory (parameter groups,
// optimizer kind) and a schedule — plus options of plain values. It knows no model, task or data set by
// name: `ampforge train` maps names to objects in train/recipe.h, and a C++ user passes their own.
//
// What the loop does for every task: epochs with evaluation after each, gradient accumulation, mixed
// precision (autocast, and a GradScaler for F16), F32 master weights, gradient clipping, LR schedules,
// checkpoints (safetensors, atomic) with exact resume, SIGINT, the NaN policy (train/nan_policy.h),
// progress and a summary, the profiler and memory traces, CUDA devices (sync-free steps with losses read
// in blocks: train/device_losses.h) and CUDA graphs (train/graph_step.h). Each of these lives once, in
// its own file; the loop calls them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/checkpoint_format.h"
#include "ampforge/core/dtype.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/nn/module.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/optim/optimizer.h"
#include "ampforge/profiler/profile_data.h"
#include "ampforge/tasks/task.h"
#include "ampforge/train/data_parallel.h"
#include "ampforge/train/ema.h"
#include "ampforge/train/nan_policy.h"
#include "ampforge/train/stop.h"

namespace ampforge::train {

// The options of a run that mean the same to every way of starting one: the Trainer takes them as they are, and
// `ampforge train`'s config (train/recipe.h TrainConfig) holds them as they are, without copies or renames.
struct RunOptions {
  int64_t epochs = 1;
  int64_t max_steps = -1;        // stop after this many optimizer steps (counting from 0); -1: no limit
  DType precision = DType::F32;  // F32 | F16 | BF16 (autocast; F16 adds a GradScaler)
  bool master_weights = false;   // parameters in `precision` with F32 masters in the optimizer (Apex O2)
  // Rebuild cheap activations (batch norm, relu, residual sums) in backward (StepOptions::recompute).
  bool recompute = false;
  // CUDA: capture the training step once, then replay it; every step decision stays on the device (no host
  // synchronisation in a step) and the losses are read every `loss_read_interval` steps.
  bool cuda_graphs = false;
  int64_t loss_read_interval = 50;
  // Checkpoints (safetensors, atomic): written after each epoch (before its evaluation), at the end and on a stop
  // signal or max_steps; `resume` continues one exactly.
  std::string save, resume;
  std::string memory_trace;      // record every allocation/free of the run's device allocator here
  bool progress = true;          // a progress bar per epoch on stderr
  bool verbose = true;           // a header line and warnings on stderr
  bool profile = false;          // collect a profile (TrainResult::profile)
  std::string profile_steps;     // "A:B": profile global steps [A, B) only ("" = all; "A:" = from A)
  std::string trace;             // write a Chrome trace here (implies profile)
};

struct TrainerOptions : RunOptions {
  int64_t accumulate = 1;       // micro-batches per optimizer step (gradient accumulation)
  bool accumulate_sum = false;  // add the micro-batches' gradients instead of averaging them (train/step.h)
  double clip_grad_norm = 0;    // 0: off
  NanPolicy nan_policy = NanPolicy::Stop;
  // LR schedule over the run. total_steps 0: the run's optimizer steps (epochs x steps per epoch).
  optim::ScheduleOptions schedule{};
  // Data: batch size, workers, augmentation, normalisation, memory format. `device` is set by the
  // trainer (batches are delivered where the model is). Evaluation uses eval_loader (shuffle off).
  data::LoaderOptions loader{};
  data::LoaderOptions eval_loader{};
  Device device = kCPU;  // cpu or cuda:N
  // The label names the run's model in the checkpoint (resume refuses another); empty: the model's type.
  std::string checkpoint_label;
  std::string config_json = "{}";  // stored in checkpoints for people reading them
  // Stored in checkpoints so that export, predict and detect rebuild the model from the file alone
  // (core/checkpoint_format.h); model empty: not stored.
  checkpoint::ModelRecord model_record;
  // An average of the weights (train/ema.h), updated after every optimizer step; evaluation runs on it and
  // checkpoints keep it. Off by default (the detection recipe turns it on, as Ultralytics does).
  EmaOptions ema{};
  // Data parallel (train/data_parallel.h): with a communicator, this process is one rank of a job. Each rank
  // reads its shard of every global batch (`loader.batch_size` examples; the global batch is that x the
  // ranks), gradients are averaged over the ranks, rank 0 alone evaluates (the metrics go to every rank)
  // and writes checkpoints, and every rank resumes from the same file. The communicator's device must be
  // `device` (MPI: cpu; NCCL: the rank's cuda device). Ranks other than 0 print nothing.
  DataParallelOptions data_parallel{};
};

struct TrainResult {
  std::string model, dataset, precision, task;
  int64_t epochs_completed = 0, steps = 0, parameters = 0;
  // Evaluation: every metric of the last evaluation, per epoch, and the task's primary metric.
  tasks::Metrics eval;
  std::vector<tasks::Metrics> epoch_eval;
  std::string primary_metric;
  // The last evaluation's details (tasks::Evaluator::details, e.g. detection's per-class table); rank 0's only.
  tasks::EvalDetails eval_details;
  // Classification's "accuracy" and "loss" of the last evaluation (0 when the task has none), and the
  // accuracy after each epoch: the figures `ampforge train` has always reported.
  double test_accuracy = 0, test_loss = 0, final_train_loss = 0;
  std::vector<double> epoch_accuracy;
  double train_samples_per_sec = 0, wall_seconds = 0, train_seconds = 0, data_wait_seconds = 0;
  int64_t peak_memory_bytes = 0;   // peak reserved by the run's caching allocator (bytes held from the OS)
  std::string memory_stats_json;   // the allocator's full statistics (memory/stats.h), as JSON
  std::string device;
  std::vector<double> losses;  // training loss per optimizer step (this run)
  // Mixed precision
  double loss_scale = 0;  // final GradScaler scale (0: no scaler)
  int64_t skipped_steps = 0, overflow_events = 0;
  // CUDA graphs: operations in the captured step (each an eager launch without graphs; kernels among
  // them) and the steps replayed (one graph launch each).
  int64_t graph_nodes = 0, graph_kernels = 0, graph_steps = 0;
  int64_t ema_updates = 0;  // updates of the weight average (0: no average kept); eval then used it
  std::string config_json;  // TrainerOptions::config_json (what `ampforge train` resolved)
  // CUDA: host synchronisations during training (cuda::host_sync_count()).
  int64_t host_syncs = 0;
  bool interrupted = false;
  std::string stopped_reason;  // "" | "interrupted" | "max_steps" | "non-finite loss at step N"
  std::string checkpoint;      // path written, if any (by rank 0 in a data-parallel run)
  int world_size = 1;          // ranks of a data-parallel run (1: one process)
  int rank = 0;
  std::shared_ptr<const profiler::ProfileData> profile;  // set when profiling was on
};

// Builds the optimizer over the model's parameters after the trainer has placed the model on its device
// and dtype (an optimizer keeps flat views of the parameters, so it must come after any move).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(nn::Module& model)>;

class Trainer {
 public:
  // Moves the model to options.device (and to options.precision with master weights), then builds the
  // optimizer. Throws InvalidArgument for inconsistent options, naming the option.
  Trainer(nn::ModulePtr model, std::shared_ptr<tasks::Task> task, OptimizerFactory make_optimizer,
          TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on `train_data`, evaluating on `eval_data` (may be null) after each epoch. Can be called once.
  TrainResult fit(std::shared_ptr<const data::Dataset> train_data, std::shared_ptr<const data::Dataset> eval_data);

  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *opt_; }
  const TrainerOptions& options() const { return o_; }

 private:
  nn::ModulePtr model_;
  std::shared_ptr<tasks::Task> task_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<DataParallel> dp_;
  TrainerOptions o_;
  bool used_ = false;
};

// "A:B" -> [A, B); "A:" -> [A, end) with B = -1. Throws InvalidArgument naming --profile-steps.
std::pair<int64_t, int64_t> parse_profile_steps(const std::string& s);

}  // namespace ampforge::train
