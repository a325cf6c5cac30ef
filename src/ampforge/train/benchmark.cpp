#include "ampforge/train/benchmark.h"

#include <algorithm>
#include <numeric>
#include <functional>
#include <optional>

#include "ampforge/core/runtime.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/global.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/train/graph_step.h"
#include "ampforge/train/step.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::train {

BenchPrecision bench_precision_from_string(const std::string& s) {
  if (s == "fp32") return BenchPrecision::FP32;
  if (s == "tf32") return BenchPrecision::TF32;
  if (s == "fp16") return BenchPrecision::FP16;
  if (s == "bf16") return BenchPrecision::BF16;
  AF_THROW(InvalidArgument, "precision must be fp32, tf32, fp16 or bf16, got '{}'", s);
}

const char* bench_precision_name(BenchPrecision p) {
  switch (p) {
    case BenchPrecision::FP32: return "fp32";
    case BenchPrecision::TF32: return "tf32";
    case BenchPrecision::FP16: return "fp16";
    case BenchPrecision::BF16: return "bf16";
  }
  return "?";
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// TF32 on for the step's lifetime only (restored after, also on an exception).
class Tf32Scope {
 public:
  Tf32Scope(runtime::DeviceRuntime& rt, bool on)
      : rt_(rt), old_gemm_(rt.allow_tf32_products()), old_conv_(rt.allow_tf32_convolutions()) {
    rt_.set_allow_tf32(on, on);
  }
  ~Tf32Scope() { rt_.set_allow_tf32(old_gemm_, old_conv_); }

 private:
  runtime::DeviceRuntime& rt_;
  bool old_gemm_, old_conv_;
};

void validate(const Workload& w, const BenchmarkOptions& o) {
  AF_CHECK(o.steps >= 1, "bench: steps must be >= 1, got {}", o.steps);
  AF_CHECK(o.warmup >= 0, "bench: warm-up steps must be >= 0, got {}", o.warmup);
  AF_CHECK(o.optimizer == "sgd" || o.optimizer == "adamw", "bench: optimizer must be sgd or adamw, got '{}'",
           o.optimizer);
  const Device dev = w.batch.x.device();
  const bool on_cuda = dev.is_cuda();
  AF_CHECK(o.precision != BenchPrecision::TF32 || on_cuda,
           "bench: tf32 is a CUDA tensor-core mode; a CPU computes fp32 or bf16/fp16");
  AF_CHECK(!o.cuda_graphs || on_cuda, "bench: --cuda-graphs needs a CUDA device");
  if (o.cuda_graphs) {
    const std::string why = cuda_graph_obstacle(*w.module, *w.task);
    AF_CHECK(why.empty(), "bench: --cuda-graphs cannot capture a {} training step: {}", w.model, why);
  }
}

// The bench's optimizer over the trainable parameters (frozen ones, YOLOv8's DFL bins, stay out, as in training).
std::unique_ptr<optim::Optimizer> bench_optimizer(nn::Module& model, const std::string& name) {
  std::vector<Tensor> trainable;
  for (const Tensor& p : model.parameters())
    if (p.requires_grad()) trainable.push_back(p);
  if (name == "sgd") {
    optim::SGDOptions so;
    so.lr = 1e-3;
    so.momentum = 0.9;
    return std::make_unique<optim::SGD>(trainable, so);
  }
  optim::AdamWOptions ao;
  ao.lr = 1e-3;
  return std::make_unique<optim::AdamW>(trainable, ao);
}

// Runs the timed steps (step(i, true) for i from `first`) and records each one's time in r: CUDA events on a GPU
// (no host wait between steps), the host clock on the CPU.
void time_steps(const std::function<void(int64_t, bool)>& step, Device dev, int64_t first, int total,
                const BenchmarkOptions& o, BenchmarkResult& r) {
  if (dev.is_cuda()) {
    std::unique_ptr<runtime::EventTimer> timer = runtime::device_runtime(dev).event_timer(dev.index);
    timer->mark();
    for (int i = 0; i < o.steps; ++i) {
      step(first + i, true);
      timer->mark();
      if (o.on_step) o.on_step(static_cast<int>(total - o.steps) + i + 1, total);
    }
    r.step_seconds = timer->intervals();
    r.timer = "cuda events";
  } else {
    for (int i = 0; i < o.steps; ++i) {
      const Stopwatch sw;
      step(first + i, true);
      r.step_seconds.push_back(sw.seconds());
      if (o.on_step) o.on_step(static_cast<int>(total - o.steps) + i + 1, total);
    }
    r.timer = "host clock";
  }
  r.median_seconds = median_of(r.step_seconds);
  r.mean_seconds = std::accumulate(r.step_seconds.begin(), r.step_seconds.end(), 0.0) /
                   static_cast<double>(r.step_seconds.size());
}

}  // namespace

BenchmarkResult benchmark_training(Workload& w, const BenchmarkOptions& o) {
  validate(w, o);
  const Device dev = w.batch.x.device();
  const bool on_cuda = dev.is_cuda();
  const int warmup = o.cuda_graphs ? std::max<int>(o.warmup, static_cast<int>(StepGraph::kWarmupSteps)) : o.warmup;
  const DType amp = o.precision == BenchPrecision::FP16   ? DType::F16
                    : o.precision == BenchPrecision::BF16 ? DType::BF16
                                                          : DType::F32;
  std::optional<Tf32Scope> tf32;
  if (on_cuda) tf32.emplace(runtime::device_runtime(dev), o.precision == BenchPrecision::TF32);

  nn::Module& model = *w.module;
  std::unique_ptr<optim::Optimizer> opt = bench_optimizer(model, o.optimizer);
  amp::GradScaler scaler(grad_scaler_options(amp));
  StepOptions so;
  so.precision = amp;
  so.recompute = o.recompute;
  so.read_loss = !on_cuda;  // on CUDA the step stays free of host waits; the loss is read once at the end
  StepGraph graph;
  Tensor last_loss;
  const std::function<void(int64_t, bool)> step = [&](int64_t i, bool timed) {
    so.global_step = i;
    if (o.cuda_graphs && timed) {
      last_loss = graph.run(model, *w.task, *opt, scaler, std::span<const data::Batch>(&w.batch, 1), so);
    } else {
      last_loss = train_step(model, *w.task, *opt, scaler, w.batch, so).loss_tensor;
    }
  };
  const int total = warmup + o.steps;
  memory::CachingAllocator* alloc = memory::caching_allocator_for(dev);
  // Cached blocks of earlier work (another cell of a bench) would count as reserved: release them first, so
  // the peaks are this step's. That happens before the last warm-up step, which then takes the page faults (CPU)
  // or the cudaMalloc calls (CUDA) of memory mapped afresh (hundreds of milliseconds for ResNet-50's ~1 GB on the
  // CPU); released after it, the first timed step paid them (a 0.6 s step among 0.25 s ones for YOLOv8n). On CUDA
  // the first warm-up step runs the cuDNN/cuBLASLt algorithm choices, whose trial workspaces are no step's memory:
  // with a single warm-up step the release follows it. With a CUDA graph it follows the capture: the eager steps'
  // blocks, cached beside the graph's own pool, are no replay's memory.
  auto release_cached = [&] {
    if (alloc == nullptr) return;
    runtime::synchronize(dev);
    alloc->empty_cache();
    alloc->reset_peak_stats();
  };
  const int release_before = o.cuda_graphs ? -1 : warmup >= (on_cuda ? 2 : 1) ? warmup - 1 : -1;
  for (int i = 0; i < warmup; ++i) {
    if (i == release_before) release_cached();
    step(i, false);
    if (o.on_step) o.on_step(i + 1, total);
  }
  if (o.cuda_graphs) step(warmup, true);  // the capture (and its first replay) is not a timed step
  runtime::synchronize(dev);
  if (release_before < 0) release_cached();

  BenchmarkResult r;
  // On CUDA the timed steps are numbered after `warmup`, the number a graph's capture step takes.
  time_steps(step, dev, on_cuda ? warmup + 1 : warmup, total, o, r);
  const double n = static_cast<double>(w.samples);
  r.samples_per_sec = r.median_seconds > 0 ? n / r.median_seconds : 0;
  r.mean_samples_per_sec = r.mean_seconds > 0 ? n / r.mean_seconds : 0;
  if (alloc != nullptr) {
    const memory::AllocatorStats st = alloc->stats();
    // With a CUDA graph the step's activations live in the graph's private pool, beside the device allocator's
    // weights, gradients and optimizer state: both count (the sum of two peaks, a bound on the joint one).
    r.peak_allocated_bytes = st.allocated.peak + graph.pool_peak_allocated_bytes();
    r.peak_reserved_bytes = st.reserved.peak + graph.pool_reserved_bytes();
  }
  for (const Tensor& p : model.parameters()) r.parameters += p.numel();
  r.last_loss = last_loss.defined() ? last_loss.item() : 0.0;
  r.graph_nodes = graph.nodes();
  if (o.profile) {
    profiler::SessionOptions po;
    po.memory_device = dev;
    profiler::Session session(po);
    session.start();
    {
      profiler::Range step_range("step", profiler::RangeKind::Step);
      step(warmup + o.steps + 1, true);
    }
    runtime::synchronize(dev);
    r.profile = session.stop();
  }
  return r;
}

}  // namespace ampforge::train
