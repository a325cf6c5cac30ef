#include "ampforge/train/trainer.h"

#include <csignal>
#include <cmath>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "ampforge/amp/autocast.h"
#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/functions.h"
#include "ampforge/autograd/node.h"
#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/allocator.h"
#include "ampforge/data/data_loader.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/stats.h"
#include "ampforge/models/models.h"
#include "ampforge/ops/ops.h"
#include "ampforge/optim/adamw.h"
#include "ampforge/optim/lr_scheduler.h"
#include "ampforge/profiler/chrome_trace.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/train/checkpoint.h"
#include "ampforge/train/progress.h"
#include "ampforge/train/step.h"
#include "ampforge/util/log.h"
#include "ampforge/util/thread_pool.h"
#include "ampforge/util/timer.h"

namespace ampforge::train {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {
void train_on_sigint(int) {
  stop_requested().store(true);  // lock-free atomic: async-signal-safe
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C stops at once
}
}  // namespace

void install_sigint_handler() { std::signal(SIGINT, train_on_sigint); }

namespace {

// "A:B" -> [A, B); "A:" -> [A, end). B < 0 means no end.
std::pair<int64_t, int64_t> parse_profile_steps(const std::string& s) {
  const size_t colon = s.find(':');
  int64_t a = -1, b = -1;
  size_t used_a = 0, used_b = 0;
  try {
    if (colon != std::string::npos && colon > 0) a = std::stoll(s.substr(0, colon), &used_a);
    if (colon != std::string::npos && colon + 1 < s.size()) b = std::stoll(s.substr(colon + 1), &used_b);
  } catch (const std::exception&) {
    a = -1;
  }
  const bool ok = colon != std::string::npos && a >= 0 && used_a == colon &&
                  (colon + 1 == s.size() || (used_b == s.size() - colon - 1 && b > a));
  AF_CHECK(ok, "--profile-steps must be A:B with 0 <= A < B (global step numbers, B exclusive) or A:, got '{}'", s);
  return {a, b};
}

void validate(const TrainConfig& c) {
  AF_CHECK(c.epochs >= 1, "--epochs must be >= 1, got {}", c.epochs);
  AF_CHECK(c.batch_size >= 1, "--batch must be >= 1, got {}", c.batch_size);
  AF_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr must be a positive number, got {}", c.lr);
  AF_CHECK(c.optimizer == "adamw" || c.optimizer == "sgd", "--optimizer must be adamw or sgd, got '{}'", c.optimizer);
  AF_CHECK(c.dataset == "fashion-mnist" || c.dataset == "mnist" || c.dataset == "synthetic",
           "--dataset must be fashion-mnist, mnist or synthetic, got '{}'", c.dataset);
  AF_CHECK(c.threads >= 0 && c.threads <= 1024, "--threads must be in [0, 1024], got {}", c.threads);
  AF_CHECK(c.workers >= 0 && c.workers <= 64, "--workers must be in [0, 64], got {}", c.workers);
  AF_CHECK(c.precision == DType::F32 || c.precision == DType::F16 || c.precision == DType::BF16,
           "--precision must be fp32, fp16 or bf16");
  AF_CHECK(!c.master_weights || c.precision != DType::F32, "--master-weights needs --precision fp16 or bf16");
  AF_CHECK(!c.stochastic_rounding || (c.master_weights && c.precision == DType::BF16),
           "--stochastic-rounding needs --precision bf16 --master-weights (it rounds the BF16 model copy)");
  AF_CHECK(c.nan_policy == "stop" || c.nan_policy == "skip", "--nan-policy must be stop or skip, got '{}'", c.nan_policy);
  AF_CHECK(c.clip_grad_norm >= 0, "--clip-grad must be >= 0");
  AF_CHECK(c.synthetic_size >= 1, "--synthetic-size must be >= 1");
  optim::schedule_from_string(c.schedule);
  if (!c.profile_steps.empty()) parse_profile_steps(c.profile_steps);
  Device dev;
  try {
    dev = Device::parse(c.device);
  } catch (const Error&) {
    AF_THROW(InvalidArgument, "--device must be cpu, cuda or cuda:N, got '{}'", c.device);
  }
  AF_CHECK(dev.is_cpu() || dev.is_cuda(), "--device must be cpu, cuda or cuda:N, got '{}'", c.device);
  if (dev.is_cuda())
    AF_CHECK(dev.index < cuda::device_count(), "--device {}: no such CUDA device ({} available{}{})", c.device,
             cuda::device_count(), cuda::device_count() == 0 ? ": " : "", cuda::unavailable_reason());
  AF_CHECK(!c.cuda_graphs || dev.is_cuda(), "--cuda-graphs needs --device cuda");
  AF_CHECK(c.loss_read_interval >= 1, "--loss-read-interval must be >= 1, got {}", c.loss_read_interval);
}

std::string precision_name(DType d) { return d == DType::F32 ? "fp32" : d == DType::F16 ? "fp16" : "bf16"; }

nlohmann::json config_json(const TrainConfig& c) {
  return {{"model", c.model},           {"dataset", c.dataset},       {"epochs", c.epochs},
          {"batch_size", c.batch_size}, {"lr", c.lr},                 {"optimizer", c.optimizer},
          {"weight_decay", c.weight_decay}, {"schedule", c.schedule}, {"seed", c.seed},
          {"precision", precision_name(c.precision)}, {"master_weights", c.master_weights},
          {"stochastic_rounding", c.stochastic_rounding},
          {"channels_last", c.channels_last}, {"device", c.device}, {"cuda_graphs", c.cuda_graphs}};
}

struct Eval {
  double accuracy = 0, loss = 0;
};

Eval evaluate(nn::Module& model, data::DataLoader& loader, DType precision) {
  profiler::Range eval_range("eval", profiler::RangeKind::Phase);
  autograd::NoGradGuard ng;
  model.eval();
  loader.start_epoch(0);
  int64_t correct = 0, total = 0;
  double loss_sum = 0;
  // On a device the sums stay there (F32: exact for counts below 2^24) and are read once at the end.
  Tensor dev_loss, dev_correct;
  while (auto b = loader.next()) {
    Tensor logits;
    {
      amp::Autocast ac(b->x.device(), precision == DType::F32 ? DType::BF16 : precision, precision != DType::F32);
      logits = model(b->x);
    }
    CrossEntropyAttrs ce;
    ce.reduction = Reduction::Sum;
    Tensor batch_loss = cross_entropy(logits.to(DType::F32), b->y, ce);
    Tensor pred = argmax(logits, 1);
    Tensor batch_correct = sum(eq(pred, b->y).to(DType::F32));
    total += b->y.numel();
    if (b->x.device().is_cpu()) {
      loss_sum += batch_loss.item();
      correct += static_cast<int64_t>(batch_correct.item());
    } else {
      dev_loss = dev_loss.defined() ? ops::add(dev_loss, batch_loss) : batch_loss;
      dev_correct = dev_correct.defined() ? ops::add(dev_correct, batch_correct) : batch_correct;
    }
  }
  if (dev_loss.defined()) {
    loss_sum = dev_loss.item();
    correct = static_cast<int64_t>(dev_correct.item());
  }
  model.train();
  return {total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0,
          total ? loss_sum / static_cast<double>(total) : 0.0};
}

// Losses of CUDA steps, kept on the device and read in blocks: one synchronisation per block instead of
// one per step.
class DeviceLosses {
 public:
  DeviceLosses(Device dev, int64_t capacity) : buf_(ops::zeros({capacity}, DType::F32, dev)), cap_(capacity) {}
  // Queues a copy of `loss` (one element) into the block; true when the block is full (read it).
  bool add(const Tensor& loss) {
    autograd::NoGradGuard ng;
    ops::copy_(ops::narrow(buf_, 0, n_, 1), loss.reshape({1}).to(DType::F32));
    return ++n_ == cap_;
  }
  // The queued losses in step order (a synchronisation); empties the block.
  std::vector<double> read() {
    std::vector<double> out;
    if (n_ == 0) return out;
    Tensor host = ops::to_device(ops::narrow(buf_, 0, 0, n_), kCPU);
    const float* v = host.data<float>();
    out.assign(v, v + n_);
    n_ = 0;
    return out;
  }

 private:
  Tensor buf_;
  int64_t cap_, n_ = 0;
};

// The trainer's CUDA-graph state: static inputs, the graph of one training step, and its loss output.
struct StepGraph {
  static constexpr int64_t kWarmupSteps = 3;  // eager steps first: lazy state (scaler, caches, algorithms)
  std::unique_ptr<cuda::Graph> graph;
  Tensor x, y, loss;
};

}  // namespace

TrainResult train(const TrainConfig& cfg_in) {
  TrainConfig cfg = cfg_in;
  validate(cfg);
  const Device dev = Device::parse(cfg.device);
  const bool on_cuda = dev.is_cuda();
  const Stopwatch wall;
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  manual_seed(cfg.seed);
  // CPU tensors come from the caching allocator: a training step frees and re-allocates the same sizes
  // every iteration, and the cache turns those into hits instead of page-faulting fresh memory.
  memory::install_host_caching_allocator();
  if (auto* ca = memory::installed_caching_allocator()) ca->reset_peak_stats();
  if (!cfg.memory_trace.empty()) memory::trace_start(cfg.memory_trace);

  // ---- data
  std::shared_ptr<data::Dataset> train_ds, test_ds;
  if (cfg.dataset == "synthetic") {
    train_ds = std::make_shared<data::SyntheticDataset>(cfg.synthetic_size, Shape{1, 28, 28}, 10, cfg.seed + 1);
    test_ds = std::make_shared<data::SyntheticDataset>(std::max<int64_t>(cfg.synthetic_size / 4, 1), Shape{1, 28, 28}, 10,
                                                       cfg.seed + 2);
  } else {
    const std::string dir = !cfg.data_dir.empty() ? cfg.data_dir
                            : cfg.dataset == "fashion-mnist" ? data::kDefaultFashionMnistDir
                                                             : "/usr/share/datasets/mnist";
    train_ds = std::make_shared<data::MnistDataset>(dir, true, cfg.dataset);
    test_ds = std::make_shared<data::MnistDataset>(dir, false, cfg.dataset);
  }
  const auto [mean, stdv] = train_ds->normalization();
  const MemoryFormat fmt = cfg.channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.seed = cfg.seed;
  lo.workers = cfg.workers;
  lo.mean = mean;
  lo.std = stdv;
  lo.crop_padding = cfg.crop_padding;
  lo.hflip = cfg.hflip;
  lo.format = fmt;
  lo.device = dev;
  data::DataLoader train_loader(train_ds, lo);
  data::LoaderOptions elo = lo;
  elo.shuffle = false;
  elo.batch_size = cfg.eval_batch_size;
  elo.crop_padding = 0;
  elo.hflip = false;
  data::DataLoader test_loader(test_ds, elo);

  // ---- model, optimizer, schedule, scaler
  models::ModelOptions mo;
  mo.in_channels = train_ds->example_shape()[0];
  mo.num_classes = train_ds->num_classes();
  mo.image_size = train_ds->example_shape()[1];
  nn::ModulePtr model = models::create(cfg.model, mo);
  if (cfg.master_weights) model->to(cfg.precision);
  if (on_cuda) model->to(dev);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(cfg, model->parameters());
  const int64_t steps_per_epoch = train_loader.num_batches();
  const int64_t total_steps = steps_per_epoch * cfg.epochs;
  optim::ScheduleOptions so;
  so.kind = optim::schedule_from_string(cfg.schedule);
  so.total_steps = total_steps;
  so.step_size = std::max<int64_t>(1, steps_per_epoch * std::max<int64_t>(1, cfg.epochs / 3));
  so.warmup_steps = cfg.warmup_steps;
  optim::LRScheduler sched(*opt, so);
  // Loss scaling is needed for F16 (narrow exponent); BF16 has F32's range, as in PyTorch's recipes.
  amp::GradScaler scaler(grad_scaler_options(cfg.precision));

  TrainResult r;
  r.model = cfg.model;
  r.dataset = cfg.dataset;
  r.precision = precision_name(cfg.precision);
  r.device = dev.str();
  r.parameters = model->num_parameters();

  CheckpointPosition pos;
  if (!cfg.resume.empty()) {
    CheckpointInfo info = load_checkpoint(cfg.resume, *model, *opt, cfg.model);
    pos = info.pos;
    default_generator().set_state(info.rng);
    if (scaler.is_enabled() && !info.scaler.empty()) scaler.load_state_dict(info.scaler);
    if (cfg.verbose)
      log(LogLevel::Warn, "resumed from '{}' at epoch {}, step {}", cfg.resume, pos.epoch + 1, pos.global_step);
  }

  auto make_info = [&](const CheckpointPosition& p) {
    CheckpointInfo info;
    info.model = cfg.model;
    info.pos = p;
    info.rng = default_generator().state();
    info.scaler = scaler.state_dict();
    info.config_json = config_json(cfg).dump();
    return info;
  };
  auto save = [&](const CheckpointPosition& p) {
    if (cfg.save.empty()) return;
    save_checkpoint(cfg.save, *model, *opt, make_info(p));
    r.checkpoint = cfg.save;
  };

  if (cfg.verbose)
    std::fprintf(stderr, "ampforge train: %s (%lld parameters) on %s, %lld epochs x %lld steps, batch %lld, %s, %s, "
                 "%d threads%s%s\n", cfg.model.c_str(), static_cast<long long>(r.parameters), cfg.dataset.c_str(),
                 static_cast<long long>(cfg.epochs), static_cast<long long>(steps_per_epoch),
                 static_cast<long long>(cfg.batch_size), cfg.optimizer.c_str(), r.precision.c_str(), get_num_threads(),
                 on_cuda ? (", device " + r.device).c_str() : "", cfg.cuda_graphs ? ", CUDA graphs" : "");

  StepOptions step_opts;  // the step itself is train_step (train/step.h), shared with `memory fit`
  step_opts.precision = cfg.precision;
  step_opts.clip_grad_norm = cfg.clip_grad_norm;
  step_opts.schedule = &sched;
  // CUDA: the step keeps every decision on the device (no synchronisation), losses are read in blocks.
  step_opts.read_loss = !on_cuda;
  std::optional<DeviceLosses> dev_losses;
  if (on_cuda) dev_losses.emplace(dev, cfg.loss_read_interval);
  StepGraph sg;
  const uint64_t syncs_before = cuda::host_sync_count();
  std::unique_ptr<profiler::Session> prof;
  std::pair<int64_t, int64_t> prof_steps{0, -1};
  if (cfg.profile || !cfg.trace.empty()) {
    if (!cfg.profile_steps.empty()) prof_steps = parse_profile_steps(cfg.profile_steps);
    prof = std::make_unique<profiler::Session>();
  }
  auto profile_window = [&](int64_t step) {  // open or close the profiled window at a step boundary
    if (!prof) return;
    if (step >= prof_steps.first && (prof_steps.second < 0 || step < prof_steps.second)) prof->start();
    else prof->pause();
  };
  int64_t samples = 0;
  double train_seconds = 0;
  stop_requested().store(false);
  model->train();
  double last_loss = 0;
  const int64_t first_step_of_run = pos.global_step;
  // Takes the losses read from the device, in step order; applies the NaN policy (without a scaler the
  // device already skipped those optimizer steps). Returns false when training must stop.
  auto take_device_losses = [&] {
    if (!dev_losses) return true;
    profiler::Range sync_range("loss read", profiler::RangeKind::Sync);
    for (double lv : dev_losses->read()) {
      const int64_t step = static_cast<int64_t>(r.losses.size());
      r.losses.push_back(lv);
      last_loss = lv;
      if (!std::isfinite(lv) && !scaler.is_enabled()) {
        if (cfg.nan_policy == "stop") {
          if (r.stopped_reason.empty())
            r.stopped_reason = fmt::format("non-finite loss ({}) at step {} (the device skipped its update; read "
                                           "at step {})", lv, step, pos.global_step);
        } else {
          ++r.skipped_steps;
        }
      }
    }
    return r.stopped_reason.empty();
  };
  for (int64_t epoch = pos.epoch; epoch < cfg.epochs && r.stopped_reason.empty(); ++epoch) {
    const int64_t skip = epoch == pos.epoch ? pos.batch_in_epoch : 0;
    train_loader.start_epoch(epoch, skip);
    Progress bar(fmt::format("epoch {}/{}", epoch + 1, cfg.epochs), steps_per_epoch, cfg.progress);
    const Stopwatch epoch_clock;
    int64_t epoch_samples = 0;
    int64_t b_in_epoch = skip;
    for (;;) {
      profile_window(pos.global_step);
      const bool in_epoch = b_in_epoch < steps_per_epoch;  // else next() ends the epoch: not a step
      profiler::Range step_range(in_epoch ? "step" : "epoch end",
                                 in_epoch ? profiler::RangeKind::Step : profiler::RangeKind::User);
      std::optional<data::Batch> batch;
      {
        profiler::Range data_range("data", profiler::RangeKind::DataWait);
        batch = train_loader.next();
      }
      if (!batch) break;
      step_opts.global_step = pos.global_step;
      double lv = std::nan("");
      if (on_cuda) {
        // Graphs need static shapes: full batches only (a short last batch runs eagerly).
        const bool graphable = cfg.cuda_graphs && batch->y.numel() == cfg.batch_size &&
                               pos.global_step - first_step_of_run >= StepGraph::kWarmupSteps;
        Tensor loss;
        if (graphable) {
          const bool capture = !sg.graph;
          if (capture) {  // static inputs: the graph reads them at every replay
            sg.x = Tensor::empty(batch->x.shape(), batch->x.dtype(), dev, batch->x.suggest_memory_format());
            sg.y = Tensor::empty(batch->y.shape(), batch->y.dtype(), dev);
          }
          ops::copy_(sg.x, batch->x);
          ops::copy_(sg.y, batch->y);
          sched.apply(pos.global_step);
          opt->sync_hyperparams();  // the lr reaches the captured step through the device hyperparameters
          if (capture) {
            // Capture once: one step recorded (not run); the replay below runs it.
            StepOptions gopts = step_opts;
            gopts.schedule = nullptr;
            auto graph = std::make_unique<cuda::Graph>(dev.index);
            graph->capture_begin();
            const StepResult captured = train_step(*model, *opt, scaler, sg.x, sg.y, gopts);
            graph->capture_end();
            sg.loss = captured.loss_tensor;
            sg.graph = std::move(graph);
            r.graph_nodes = sg.graph->num_nodes();
            r.graph_kernels = sg.graph->num_kernel_nodes();
            // Per replayed step: the graph, two input copies, the loss copy (+ an lr fill when it changes).
            r.graph_launches_per_step = 4;
          }
          sg.graph->replay();
          ++r.graph_steps;
          loss = sg.loss;
        } else {
          loss = train_step(*model, *opt, scaler, batch->x, batch->y, step_opts).loss_tensor;
        }
        if (dev_losses->add(loss) && !take_device_losses()) {
          save({epoch, b_in_epoch + 1, pos.global_step + 1});
          ++pos.global_step;
          break;
        }
      } else {
        const StepResult sr = train_step(*model, *opt, scaler, batch->x, batch->y, step_opts);
        lv = sr.loss;
        if (!sr.backward_ran) {  // non-finite loss without a scaler: no backward, no step
          if (cfg.nan_policy == "stop") {
            r.stopped_reason = fmt::format("non-finite loss ({}) at step {}", lv, pos.global_step);
            save({epoch, b_in_epoch, pos.global_step});
            break;
          }
          ++r.skipped_steps;
        } else if (!sr.stepped) {
          ++r.overflow_events;
        }
        r.losses.push_back(lv);
        last_loss = lv;
      }
      profiler::sample_memory();
      ++pos.global_step;
      if (!cfg.memory_trace.empty()) memory::step();  // a step boundary in the trace and the timeline
      ++b_in_epoch;
      epoch_samples += batch->y.numel();
      bar.update(b_in_epoch, fmt::format("loss {:.4f} {:.0f} samples/s", last_loss,
                                         static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
      const bool at_max = cfg.max_steps >= 0 && pos.global_step >= cfg.max_steps;
      if (stop_requested().load() || at_max) {
        take_device_losses();
        const bool epoch_done = b_in_epoch >= steps_per_epoch;
        CheckpointPosition p{epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : b_in_epoch, pos.global_step};
        r.stopped_reason = at_max ? "max_steps" : "interrupted";
        r.interrupted = !at_max;
        save(p);
        break;
      }
    }
    // CUDA: the epoch's work is done only when its last losses arrive (this read waits for it).
    if (r.stopped_reason.empty() && !take_device_losses()) save({epoch + 1, 0, pos.global_step});
    train_seconds += epoch_clock.seconds();
    samples += epoch_samples;
    r.final_train_loss = last_loss;
    if (!r.stopped_reason.empty()) {
      bar.finish(fmt::format("stopped: {}", r.stopped_reason));
      break;
    }
    Eval ev = evaluate(*model, test_loader, cfg.precision);
    r.epoch_accuracy.push_back(ev.accuracy);
    r.test_accuracy = ev.accuracy;
    r.test_loss = ev.loss;
    ++r.epochs_completed;
    bar.finish(fmt::format("loss {:.4f}, test accuracy {:.2f}%, {:.0f} samples/s", last_loss, 100.0 * ev.accuracy,
                           static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
    save({epoch + 1, 0, pos.global_step});
  }
  // Stopped by --max-steps before an epoch ended: evaluate once so the summary has an accuracy. After
  // Ctrl-C the user wants out, and after a non-finite loss the model is not worth evaluating.
  if (r.epochs_completed == 0 && r.stopped_reason == "max_steps") {
    Eval ev = evaluate(*model, test_loader, cfg.precision);
    r.test_accuracy = ev.accuracy;
    r.test_loss = ev.loss;
  }
  if (prof) {
    auto data = std::make_shared<profiler::ProfileData>(prof->stop());
    if (!cfg.trace.empty()) profiler::write_chrome_trace(*data, cfg.trace);
    r.profile = std::move(data);
  }
  r.steps = static_cast<int64_t>(r.losses.size());
  r.train_seconds = train_seconds;
  r.train_samples_per_sec = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0;
  r.data_wait_seconds = train_loader.wait_seconds();
  if (on_cuda) r.host_syncs = static_cast<int64_t>(cuda::host_sync_count() - syncs_before);
  r.wall_seconds = wall.seconds();
  if (!cfg.memory_trace.empty()) memory::trace_stop();
  memory::CachingAllocator* cuda_alloc = on_cuda ? cuda::caching_allocator(dev.index) : nullptr;
  if (cuda_alloc != nullptr) {
    const memory::AllocatorStats st = cuda_alloc->stats();
    r.peak_memory_bytes = st.reserved.peak;
    r.memory_stats_json = memory::stats_to_json(st).dump();
  } else if (auto st = memory::allocator_stats()) {
    r.peak_memory_bytes = st->reserved.peak;
    r.memory_stats_json = memory::stats_to_json(*st).dump();
  } else {
    r.peak_memory_bytes = host_allocator_peak_bytes();
  }
  r.loss_scale = scaler.is_enabled() ? scaler.get_scale() : 0.0;
  r.skipped_steps += scaler.skipped_steps();
  if (on_cuda) r.overflow_events = scaler.skipped_steps();  // the device decided; counted there
  return r;
}

}  // namespace ampforge::train
