// Timing of full training steps (what `ampforge bench` measures): forward, the task's loss, backward and
// the optimizer step, with the GradScaler for FP16 — the trainer's own step (train/step.h), optionally as
// a CUDA graph (train/graph_step.h) — over a synthetic workload (train/workload.h).
//
// Warm-up steps are run and not timed. On a CUDA device each step is timed on the device with timing
// events around it (cuda::EventTimer; one host wait at the end); on the CPU with the host's monotonic
// clock. Peak memory is that of the device's caching allocator over the timed steps (its peak statistics
// are reset after the warm-up), so it counts weights, gradients, optimizer state and activations.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ampforge/core/dtype.h"
#include "ampforge/profiler/profile_data.h"
#include "ampforge/train/workload.h"

namespace ampforge::train {

// What a step computes in: true F32, F32 with TF32 tensor-core GEMMs/convolutions (CUDA only; its own
// column, never called FP32), or autocast to FP16 / BF16.
enum class BenchPrecision { FP32, TF32, FP16, BF16 };
BenchPrecision bench_precision_from_string(const std::string& s);  // fp32|tf32|fp16|bf16, else InvalidArgument
const char* bench_precision_name(BenchPrecision p);                // "fp32", ...

struct BenchmarkOptions {
  BenchPrecision precision = BenchPrecision::FP32;
  int warmup = 2;                 // untimed steps first (a CUDA graph needs StepGraph::kWarmupSteps eager ones)
  int steps = 5;                  // timed steps
  std::string optimizer = "sgd";  // sgd (momentum 0.9) | adamw, lr 1e-3, as the peer script
  bool cuda_graphs = false;       // CUDA: capture the step once after the warm-up, replay it
  bool recompute = false;         // rebuild cheap activations in backward (StepOptions::recompute)
  // One more step after the timed ones, under the profiler (ops, phases; kernels on a GPU); not timed, so
  // the profiler's cost never reaches the figures. Its data lands in BenchmarkResult::profile.
  bool profile = false;
  // Called after every step (warm-up ones too) with (steps done, total steps): progress output.
  std::function<void(int, int)> on_step;
};

struct BenchmarkResult {
  std::vector<double> step_seconds;  // each timed step
  double median_seconds = 0, mean_seconds = 0;
  double samples_per_sec = 0;        // batch / median step time
  double mean_samples_per_sec = 0;   // batch / mean step time
  int64_t peak_allocated_bytes = -1, peak_reserved_bytes = -1;  // -1: no caching allocator to ask
  int64_t parameters = 0;
  double last_loss = 0;              // the last timed step's loss (a finite number shows the step worked)
  std::string timer;                 // "cuda events" | "host clock"
  int64_t graph_nodes = 0;           // operations in the captured step (cuda_graphs)
  std::optional<profiler::ProfileData> profile;  // options.profile: the profiled step
};

// Runs options.warmup + options.steps training steps of `w` (its model is updated). Throws what the
// step throws (e.g. NotImplemented for a precision the device cannot run).
BenchmarkResult benchmark_training(Workload& w, const BenchmarkOptions& options);

}  // namespace ampforge::train
