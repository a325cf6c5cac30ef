// Trainer: the training loop behind `ampforge train` — epochs, evaluation after each epoch, progress,
// a final summary, checkpoints (safetensors, written atomically) and exact resume, SIGINT handling,
// mixed precision (autocast + GradScaler) and the NaN policy.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/core/dtype.h"
#include "ampforge/nn/module.h"
#include "ampforge/profiler/profile_data.h"

namespace ampforge::train {

struct TrainConfig {
  std::string model = "cnn";
  std::string dataset = "fashion-mnist";  // fashion-mnist | mnist | synthetic
  std::string data_dir;                    // default: Debian's install dir for the dataset
  int64_t epochs = 5;
  int64_t batch_size = 128;
  double lr = 1e-3;
  std::string optimizer = "adamw";         // adamw | sgd
  double weight_decay = -1;                // < 0: the optimizer's default (AdamW 1e-2, SGD 0)
  double momentum = 0.9;                   // SGD
  bool nesterov = false;
  std::string schedule = "cosine";         // constant | step | cosine
  int64_t warmup_steps = 0;
  double clip_grad_norm = 0;               // 0: off
  int threads = 0;                         // 0: all cores
  int workers = 1;                         // data-loader threads
  uint64_t seed = 0;
  bool channels_last = true;
  int64_t crop_padding = 0;                // augmentation
  bool hflip = false;
  DType precision = DType::F32;            // F32 | F16 | BF16 (autocast + GradScaler for F16)
  bool master_weights = false;             // keep parameters in 16 bits with F32 masters in the optimizer
  bool stochastic_rounding = false;        // BF16 master weights: round the model copy stochastically
  std::string nan_policy = "stop";         // stop | skip: what to do with a non-finite loss without a scaler
  int64_t max_steps = -1;                  // stop after this many optimizer steps (counting from 0)
  int64_t synthetic_size = 2048;           // examples in the synthetic training split
  int64_t eval_batch_size = 1000;
  std::string save;                        // checkpoint path (written each epoch, at the end, on SIGINT)
  std::string resume;                      // checkpoint to resume from
  std::string memory_trace;                // record every allocation/free here (ampforge-memtrace v1)
  bool progress = true;
  bool verbose = true;                     // human summary on stderr
  // Profiler (docs/PROFILER.md): ranges for every op, phase, data wait and host sync.
  bool profile = false;                    // collect a profile (TrainResult::profile)
  std::string profile_steps;               // "A:B": profile global steps [A, B) only ("" = all; "A:" = from A)
  std::string trace;                       // write a Chrome trace here (implies profile)
  // Device (docs/ARCHITECTURE.md, "Training on CUDA"): "cpu", "cuda" or "cuda:N". On CUDA, batches are
  // uploaded on the copy stream while the previous step computes, every step decision stays on the device
  // (no host synchronisation in a step) and losses are read in blocks of `loss_read_interval` steps.
  std::string device = "cpu";
  bool cuda_graphs = false;                // CUDA: capture the training step once, then replay it
  int64_t loss_read_interval = 50;         // CUDA: steps between reads of the losses (one synchronisation)
};

struct TrainResult {
  std::string model, dataset, precision;
  int64_t epochs_completed = 0, steps = 0, parameters = 0;
  double test_accuracy = 0, test_loss = 0, final_train_loss = 0;
  double train_samples_per_sec = 0, wall_seconds = 0, train_seconds = 0, data_wait_seconds = 0;
  int64_t peak_memory_bytes = 0;   // peak reserved by the caching allocator (bytes held from the OS)
  std::string memory_stats_json;   // the allocator's full statistics (memory/stats.h), as JSON
  std::string device;
  std::vector<double> losses;         // training loss per step (this run)
  std::vector<double> epoch_accuracy;  // test accuracy after each epoch (this run)
  // Mixed precision
  double loss_scale = 0;  // final GradScaler scale (0: no scaler)
  int64_t skipped_steps = 0, overflow_events = 0;
  // CUDA graphs: operations in the captured step (each an eager launch without graphs; kernels among
  // them), launches per replayed step (the graph, the input copies and the loss copy), steps replayed.
  int64_t graph_nodes = 0, graph_kernels = 0, graph_launches_per_step = 0, graph_steps = 0;
  // CUDA: host synchronisations during training (cuda::host_sync_count()), and per step.
  int64_t host_syncs = 0;
  bool interrupted = false;
  std::string stopped_reason;  // "" | "interrupted" | "max_steps" | "non-finite loss at step N"
  std::string checkpoint;      // path written, if any
  std::shared_ptr<const profiler::ProfileData> profile;  // set when profiling was on
};

// Validates the config (throws InvalidArgument with the flag's name) and runs it.
TrainResult train(const TrainConfig& cfg);

// Process-wide stop request (SIGINT handler sets it; the trainer finishes the current step).
std::atomic<bool>& stop_requested();
// Installs a SIGINT handler that sets stop_requested() once; a second SIGINT kills as usual.
void install_sigint_handler();

}  // namespace ampforge::train
