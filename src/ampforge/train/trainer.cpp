#include "ampforge/train/trainer.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/amp/autocast.h"
#include "ampforge/amp/grad_scaler.h"
#include "ampforge/autograd/node.h"
#include "ampforge/core/runtime.h"
#include "ampforge/core/allocator.h"
#include "ampforge/core/generator.h"
#include "ampforge/dist/environment.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/stats.h"
#include "ampforge/profiler/chrome_trace.h"
#include "ampforge/profiler/profiler.h"
#include "ampforge/train/checkpoint.h"
#include "ampforge/train/device_losses.h"
#include "ampforge/train/graph_step.h"
#include "ampforge/train/progress.h"
#include "ampforge/train/step.h"
#include "ampforge/util/log.h"
#include "ampforge/util/signals.h"
#include "ampforge/util/thread_pool.h"
#include "ampforge/util/timer.h"

namespace ampforge::train {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {
// The stop signals' state (install_stop_signals). A checkpoint being written holds off "stop at once": a second
// Ctrl-C or SIGTERM during a save takes effect when the file is complete.
std::mutex g_stop_mutex;
int g_stop_signal = 0;     // the first stop signal, 0 before one
int g_saves = 0;           // checkpoints being written
int g_die_after_save = 0;  // a signal whose default action waits for the save to end
std::atomic<bool> g_training{false};  // a fit() is between its first and last step: what a stop message says

struct TrainingScope {
  TrainingScope() { g_training.store(true); }
  ~TrainingScope() { g_training.store(false); }
  TrainingScope(const TrainingScope&) = delete;
  TrainingScope& operator=(const TrainingScope&) = delete;
};

void die_unless_saving(int sig) {
  {
    std::lock_guard<std::mutex> lk(g_stop_mutex);
    if (g_saves > 0) {
      g_die_after_save = sig;
      return;
    }
  }
  die_by_signal(sig);
}

// Without install_stop_signals (a library caller), SIGTERM keeps its default action; a save defers it by a
// handler of its own: a launcher stopping a job (mpirun, `ampforge launch`, Slurm) sends SIGTERM before SIGKILL,
// and the file must be complete when the process dies.
std::atomic<bool> g_sigterm_pending{false};
void defer_sigterm(int) { g_sigterm_pending.store(true); }

class SaveScope {
 public:
  SaveScope() {
    {
      std::lock_guard<std::mutex> lk(g_stop_mutex);
      ++g_saves;
    }
    if (!watching_signal(SIGTERM)) {
      struct sigaction sa{};
      sa.sa_handler = defer_sigterm;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGTERM, &sa, &old_);
      deferring_ = true;
    }
  }
  ~SaveScope() {
    if (deferring_) {
      sigaction(SIGTERM, &old_, nullptr);
      if (g_sigterm_pending.exchange(false)) std::raise(SIGTERM);
    }
    int die = 0;
    {
      std::lock_guard<std::mutex> lk(g_stop_mutex);
      if (--g_saves == 0) die = std::exchange(g_die_after_save, 0);
    }
    if (die != 0) die_by_signal(die);
  }
  SaveScope(const SaveScope&) = delete;
  SaveScope& operator=(const SaveScope&) = delete;

 private:
  bool deferring_ = false;
  struct sigaction old_{};
};
}  // namespace

int stop_signal() {
  std::lock_guard<std::mutex> lk(g_stop_mutex);
  return g_stop_signal;
}

void install_stop_signals() {
  // On watcher threads, not in handlers: a handler on a thread inside oneDNN's JIT GEMM corrupts the heap
  // (util/signals.h). Launchers pass signals to every rank: one of them says so.
  bool say = true;
  try {
    say = dist::detect_world().rank == 0;
  } catch (const Error&) {  // a malformed environment: train() reports it
  }
  // Before the first step (a corpus being tokenised, data being prepared) the run ends without training.
  auto request = [say](int sig, const char* what, const char* again) {
    {
      std::lock_guard<std::mutex> lk(g_stop_mutex);
      if (g_stop_signal == 0) g_stop_signal = sig;
    }
    if (say)
      std::fprintf(stderr, "\n%s: %s%s\n", what,
                   g_training.load() ? "stopping after this step" : "stopping before training starts", again);
    stop_requested().store(true);  // after the message: who sees the flag sees the message written
  };
  watch_signal(SIGINT, [request](int count) {
    if (count > 1) return die_unless_saving(SIGINT);  // a second Ctrl-C stops at once
    request(SIGINT, "interrupted", " (Ctrl-C again to stop at once)");
  });
  watch_signal(SIGTERM, [request](int count) {
    if (count > 1) return die_unless_saving(SIGTERM);
    request(SIGTERM, "SIGTERM", " (SIGTERM again to stop at once)");
  });
  watch_signal(SIGUSR1, [request](int count) {
    if (count == 1) request(SIGUSR1, "SIGUSR1", "");
    stop_requested().store(true);
  });
}

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

namespace {

const char* precision_name(DType d) { return d == DType::F32 ? "fp32" : d == DType::F16 ? "fp16" : "bf16"; }

void validate(const TrainerOptions& o) {
  AF_CHECK(o.epochs >= 1, "--epochs must be >= 1, got {}", o.epochs);
  AF_CHECK(o.accumulate >= 1, "--accumulate must be >= 1, got {}", o.accumulate);
  AF_CHECK(o.precision == DType::F32 || o.precision == DType::F16 || o.precision == DType::BF16,
           "--precision must be fp32, fp16 or bf16");
  AF_CHECK(!o.master_weights || o.precision != DType::F32, "--master-weights needs --precision fp16 or bf16");
  AF_CHECK(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm), "--clip-grad must be >= 0, got {}",
           o.clip_grad_norm);
  AF_CHECK(o.loader.batch_size >= 1, "--batch must be >= 1, got {}", o.loader.batch_size);
  AF_CHECK(o.eval_loader.batch_size >= 1, "the evaluation batch size must be >= 1, got {}", o.eval_loader.batch_size);
  AF_CHECK(o.device.is_cpu() || o.device.is_cuda(), "--device must be cpu, cuda or cuda:N, got '{}'", o.device.str());
  runtime::check_device_exists(o.device, "--device " + o.device.str());
  AF_CHECK(!o.cuda_graphs || o.device.is_cuda(), "--cuda-graphs needs --device cuda");
  AF_CHECK(o.loss_read_interval >= 1, "--loss-read-interval must be >= 1, got {}", o.loss_read_interval);
  if (!o.profile_steps.empty()) parse_profile_steps(o.profile_steps);
}

// One evaluation pass: eval mode, no graph, the run's autocast; the task's evaluator keeps the sums.
// With a weight average, the pass runs on the averaged weights (the model's own come back afterwards).
// The evaluator's details (tasks::Evaluator::details) go to `details`.
tasks::Metrics evaluate(nn::Module& model, tasks::Task& task, data::DataLoader& loader, DType precision,
                        const ModelEma* ema, tasks::EvalDetails& details) {
  profiler::Range eval_range("eval", profiler::RangeKind::Phase);
  autograd::NoGradGuard ng;
  std::optional<ModelEma::Applied> averaged;
  if (ema) averaged.emplace(ema->apply_to(model));
  model.eval();
  loader.start_epoch(0);
  std::unique_ptr<tasks::Evaluator> ev = task.evaluator();
  bool stopped = false;
  while (auto b = loader.next()) {
    if ((stopped = stop_requested().load())) break;  // Ctrl-C: no metrics of part of the split
    amp::Autocast ac(b->x.device(), precision == DType::F32 ? DType::BF16 : precision, precision != DType::F32);
    ev->add(model, *b);
  }
  model.train();
  if (stopped) return {};
  tasks::Metrics m = ev->result();
  details = ev->details();
  return m;
}

// Rank 0's metrics on every rank (only rank 0 evaluates in a data-parallel run).
tasks::Metrics broadcast_metrics(dist::Communicator& comm, const tasks::Metrics& m) {
  nlohmann::json j = nlohmann::json::array();
  for (const tasks::Metric& x : m) j.push_back({x.name, x.value, x.fraction});
  const nlohmann::json got = nlohmann::json::parse(comm.broadcast_string(j.dump(), 0));
  tasks::Metrics out;
  for (const auto& e : got) out.push_back({e[0].get<std::string>(), e[1].get<double>(), e[2].get<bool>()});
  return out;
}

double metric_or_zero(const tasks::Metrics& m, const char* name) {
  const double v = tasks::metric_value(m, name);
  return std::isnan(v) ? 0.0 : v;
}

}  // namespace

Trainer::Trainer(nn::ModulePtr model, std::shared_ptr<tasks::Task> task, OptimizerFactory make_optimizer,
                 TrainerOptions options)
    : model_(std::move(model)), task_(std::move(task)), o_(std::move(options)) {
  AF_CHECK(model_ != nullptr, "Trainer: no model");
  AF_CHECK(task_ != nullptr, "Trainer: no task");
  AF_CHECK(make_optimizer != nullptr, "Trainer: no optimizer factory");
  validate(o_);
  if (o_.cuda_graphs) {
    const std::string why = cuda_graph_obstacle(*model_, *task_);
    AF_CHECK(why.empty(), "--cuda-graphs cannot capture this training step: {}; train without --cuda-graphs", why);
  }
  // CPU tensors come from the caching allocator (memory/global.h): a training step frees and re-allocates
  // the same sizes every iteration, and the cache turns those into hits instead of page-faulting fresh
  // memory. Installed before the optimizer's flat buffers exist, so they come from it too.
  memory::install_host_caching_allocator();
  if (o_.master_weights) model_->to(o_.precision);
  if (o_.device.is_cuda()) model_->to(o_.device);
  const dist::CommunicatorPtr& comm = o_.data_parallel.communicator;
  if (comm) {
    AF_CHECK(comm->device() == o_.device, "data parallel: the communicator ({}) works on {}, the trainer's device is {}",
             comm->backend(), comm->device().str(), o_.device.str());
    AF_CHECK(!o_.cuda_graphs, "--cuda-graphs cannot be combined with data parallel: the collectives run on NCCL's "
                              "own stream, outside the captured step");
    AF_CHECK(o_.data_parallel.zero == 0 || o_.clip_grad_norm == 0, "--clip-grad cannot be combined with --zero 1 yet "
             "(each rank holds a shard of the gradients; the norm would need a reduction across the ranks)");
    if (comm->rank() != 0) o_.progress = o_.verbose = false;
    // Before the optimizer: it copies the parameters (and F32 masters of 16-bit ones) into its buffers.
    sync_model_from_rank0(*comm, *model_);
    if (o_.data_parallel.sync_batchnorm) {
      const int n = convert_sync_batchnorm(*model_, comm);
      AF_CHECK(n > 0, "--sync-bn: the model has no BatchNorm2d layer to synchronise");
    }
  }
  opt_ = make_optimizer(*model_);
  AF_CHECK(opt_ != nullptr, "Trainer: the optimizer factory returned no optimizer");
  if (comm) dp_ = std::make_unique<DataParallel>(comm, *opt_, o_.data_parallel);
}

Trainer::~Trainer() = default;

TrainResult Trainer::fit(std::shared_ptr<const data::Dataset> train_data,
                         std::shared_ptr<const data::Dataset> eval_data) {
  AF_CHECK(!used_, "Trainer::fit can run once per Trainer (make a new one to train again)");
  used_ = true;
  AF_CHECK(train_data != nullptr, "Trainer::fit: no training data");
  const Device dev = o_.device;
  const bool on_cuda = dev.is_cuda();
  nn::Module& model = *model_;
  tasks::Task& task = *task_;
  optim::Optimizer& opt = *opt_;
  const Stopwatch wall;
  if (auto* ca = memory::installed_caching_allocator()) ca->reset_peak_stats();
  // The peak and the trace are those of the training device's allocator (the CUDA caching allocator when
  // training there), not the host's.
  if (on_cuda) {
    if (auto* ca = memory::caching_allocator_for(dev)) ca->reset_peak_stats();
  }
  if (!o_.memory_trace.empty()) memory::trace_start(o_.memory_trace, dev);

  // ---- data
  data::LoaderOptions lo = o_.loader;
  lo.device = dev;
  DataParallel* dp = dp_.get();
  const int world = dp ? dp->comm().size() : 1;
  const int rank = dp ? dp->comm().rank() : 0;
  lo.shard_rank = rank;
  lo.shard_count = world;
  data::DataLoader train_loader(train_data, lo);
  std::optional<data::DataLoader> eval_loader;
  if (eval_data) {
    data::LoaderOptions elo = o_.eval_loader;
    elo.device = dev;
    elo.shuffle = false;
    eval_loader.emplace(eval_data, elo);
  }

  // ---- schedule, scaler
  const int64_t k = o_.accumulate;
  const int64_t batches_per_epoch = train_loader.num_batches();
  const int64_t steps_per_epoch = (batches_per_epoch + k - 1) / k;
  optim::ScheduleOptions so = o_.schedule;
  if (so.total_steps <= 0) so.total_steps = steps_per_epoch * o_.epochs;
  if (so.kind == optim::Schedule::Step && so.step_size <= 0)
    so.step_size = std::max<int64_t>(1, steps_per_epoch * std::max<int64_t>(1, o_.epochs / 3));
  optim::LRScheduler sched(opt, so);
  // Loss scaling is needed for F16 (narrow exponent); BF16 has F32's range, as in PyTorch's recipes.
  amp::GradScaler scaler(grad_scaler_options(o_.precision));
  NanGuard nan(o_.nan_policy, scaler.is_enabled());
  const std::string label = o_.checkpoint_label.empty() ? model.type_name() : o_.checkpoint_label;

  TrainResult r;
  r.precision = precision_name(o_.precision);
  r.device = dev.str();
  r.task = task.name();
  r.primary_metric = task.primary_metric();
  r.parameters = model.num_parameters();
  r.world_size = world;
  r.rank = rank;
  std::optional<ModelEma> ema;
  if (o_.ema.enabled) ema.emplace(model, o_.ema);
  // Rank 0 alone evaluates in a data-parallel run; the others receive its metrics (not its details). With a
  // weight average, on it.
  // Whether a stop was asked for, the same answer on every rank (a collective: all ranks ask at the same point).
  auto stop_agreed = [&] {
    const bool stop = stop_requested().load();
    return dp ? dp->any(stop) : stop;
  };
  auto stop_interrupted = [&] {
    r.stopped_reason = "interrupted";
    r.interrupted = true;
  };
  // The evaluation's metrics; none when a stop came during it (evaluate() then stops early, and metrics of part of
  // the split are not reported).
  auto run_eval = [&]() -> std::optional<tasks::Metrics> {
    tasks::Metrics m;
    if (rank == 0) {
      // The weight average is swapped in and the model's own weights written back: the same values, so F32
      // masters (--master-weights) stay as they are instead of restarting from the 16-bit parameters.
      const std::vector<char> masters = ema ? opt.masters_in_sync() : std::vector<char>{};
      m = evaluate(model, task, *eval_loader, o_.precision, ema ? &*ema : nullptr, r.eval_details);
      if (ema) opt.keep_masters_after_restore(masters);
    }
    if (dp) {
      // The other ranks wait here for as long as rank 0 evaluates, which no limit meant for a hung rank bounds
      // (--collective-timeout; a rank 0 that dies meanwhile ends the job through the launcher).
      const dist::ScopedCollectiveTimeout while_rank0_evaluates(dp->comm(), 0);
      m = broadcast_metrics(dp->comm(), m);
    }
    if (stop_agreed()) return std::nullopt;
    return m;
  };
  CheckpointPosition pos;
  if (!o_.resume.empty()) {
    CheckpointInfo info = load_checkpoint(o_.resume, model, opt, label);
    pos = info.pos;
    if (ema && !info.ema.empty()) {
      ema->load(info.ema, info.ema_updates);
    } else if (ema) {
      ema.emplace(model, o_.ema);  // from the resumed weights
      if (o_.verbose) log(LogLevel::Warn, "'{}' has no weight average: the average starts from its weights", o_.resume);
    } else if (!info.ema.empty() && o_.verbose) {
      log(LogLevel::Warn, "'{}' has a weight average, which this run (no EMA) drops", o_.resume);
    }
    default_generator().set_state(info.rng);
    if (scaler.is_enabled() && !info.scaler.empty()) scaler.load_state_dict(info.scaler);
    if (o_.verbose)
      log(LogLevel::Warn, "resumed from '{}' at epoch {}, step {}", o_.resume, pos.epoch + 1, pos.global_step);
  }
  if (!o_.save.empty()) check_checkpoint_path(o_.save);
  auto save = [&](const CheckpointPosition& p) {
    if (o_.save.empty()) return;
    r.checkpoint = o_.save;
    // Sharded optimizer state is gathered from every rank (all call this); rank 0 writes the job's checkpoint.
    const auto opt_state = dp ? dp->optimizer_state() : opt.state_dict();
    // Every rank's work so far, the collectives included, has completed before rank 0 reads the state: a
    // communicator that failed meanwhile (a rank stopped taking part: NCCL's watchdog aborted it, and the
    // gradients since are garbage) throws here instead of a checkpoint overwriting the last good one.
    if (dp) dp->comm().barrier();
    if (rank != 0) return;
    CheckpointInfo info;
    info.model = label;
    info.pos = p;
    info.rng = default_generator().state();
    info.scaler = scaler.state_dict();
    info.config_json = o_.config_json;
    info.record = o_.model_record;
    if (ema) {
      info.ema = ema->full_state_dict(model);
      info.ema_updates = ema->updates();
    }
    SaveScope whole_file;
    save_checkpoint(o_.save, model, opt, opt_state, info);
  };

  if (o_.verbose)
    std::fprintf(stderr, "ampforge train: %s (%lld parameters), %s, %lld epochs x %lld steps, batch %lld%s, %s, %s, "
                 "%d threads%s%s%s\n", label.c_str(), static_cast<long long>(r.parameters), task.name().c_str(),
                 static_cast<long long>(o_.epochs), static_cast<long long>(steps_per_epoch),
                 static_cast<long long>(lo.batch_size), k > 1 ? fmt::format(" x {} accumulated", k).c_str() : "",
                 opt.name(), r.precision.c_str(), get_num_threads(), on_cuda ? (", device " + r.device).c_str() : "",
                 o_.cuda_graphs ? ", CUDA graphs" : "",
                 dp ? fmt::format(", data parallel: {} ranks ({}, {}), global batch {}", world, dp->comm().backend(),
                                  dp->zero_stage() == 1 ? std::string("ZeRO-1: optimizer state sharded")
                                  : fmt::format("{} gradient buckets{}", dp->buckets().size(),
                                                o_.data_parallel.overlap ? " started from backward" : ""),
                                  lo.batch_size * world * k).c_str()
                    : "");
  // What the device does with this precision that the user would not guess (BF16 on a CPU without fast BF16).
  if (o_.verbose)
    if (const std::string note = runtime::device_runtime(dev).precision_note(o_.precision); !note.empty())
      std::fprintf(stderr, "note: %s\n", note.c_str());

  StepOptions step_opts;
  step_opts.precision = o_.precision;
  step_opts.clip_grad_norm = o_.clip_grad_norm;
  step_opts.sum_micro_batches = o_.accumulate_sum;
  step_opts.recompute = o_.recompute;
  step_opts.schedule = &sched;
  // CUDA: the step keeps every decision on the device (no synchronisation), losses are read in blocks.
  step_opts.read_loss = !on_cuda;
  step_opts.data_parallel = dp;
  std::optional<DeviceLosses> dev_losses;
  // Every epoch end reads the losses too, so a block never holds more than an epoch's steps: a huge interval
  // (read only at epoch ends) allocates no more device memory than that.
  if (on_cuda) dev_losses.emplace(dev, std::min(o_.loss_read_interval, std::max<int64_t>(steps_per_epoch, 1)));
  StepGraph graph;
  runtime::DeviceRuntime& rt = runtime::device_runtime(dev);
  const uint64_t syncs_before = rt.host_sync_count();
  std::unique_ptr<profiler::Session> prof;
  std::pair<int64_t, int64_t> prof_steps{0, -1};
  if (o_.profile || !o_.trace.empty()) {
    if (!o_.profile_steps.empty()) prof_steps = parse_profile_steps(o_.profile_steps);
    prof = std::make_unique<profiler::Session>(profiler::SessionOptions{.memory_device = dev});
  }
  auto profile_window = [&](int64_t step) {  // open or close the profiled window at a step boundary
    if (!prof) return;
    if (step >= prof_steps.first && (prof_steps.second < 0 || step < prof_steps.second)) prof->start();
    else prof->pause();
  };
  int64_t samples = 0;
  double train_seconds = 0;
  // A stop asked for before training started (a Ctrl-C while the data was prepared): no step runs, nothing is
  // saved. The flag is not cleared: a stop signal ends the process's training (a library caller that wants to train
  // again after one clears stop_requested() itself).
  if (stop_agreed()) stop_interrupted();
  const TrainingScope training_scope;
  model.train();
  double last_loss = 0;
  const int64_t first_step_of_run = pos.global_step;
  // Takes the losses read from the device, in step order, through the NaN policy (without a scaler the
  // device already skipped those optimizer steps). Returns false when training must stop.
  auto take_device_losses = [&] {
    if (!dev_losses) return true;
    profiler::Range sync_range("loss read", profiler::RangeKind::Sync);
    for (double lv : dev_losses->read()) {
      const int64_t step = first_step_of_run + static_cast<int64_t>(r.losses.size());
      r.losses.push_back(lv);
      last_loss = lv;
      nan.observe(lv, step, pos.global_step);
    }
    return !nan.stopped();
  };
  std::vector<data::Batch> micro;
  micro.reserve(static_cast<size_t>(k));
  for (int64_t epoch = pos.epoch; epoch < o_.epochs && r.stopped_reason.empty(); ++epoch) {
    const int64_t skip = epoch == pos.epoch ? pos.batch_in_epoch : 0;  // batches (micro-batches) done
    train_loader.start_epoch(epoch, skip);
    Progress bar(fmt::format("epoch {}/{}", epoch + 1, o_.epochs), steps_per_epoch, o_.progress);
    const Stopwatch epoch_clock;
    int64_t epoch_samples = 0;
    int64_t b_in_epoch = skip;
    for (;;) {
      profile_window(pos.global_step);
      const bool in_epoch = b_in_epoch < batches_per_epoch;  // else next() ends the epoch: not a step
      profiler::Range step_range(in_epoch ? "step" : "epoch end",
                                 in_epoch ? profiler::RangeKind::Step : profiler::RangeKind::User);
      micro.clear();
      {
        profiler::Range data_range("data", profiler::RangeKind::DataWait);
        while (static_cast<int64_t>(micro.size()) < k) {
          std::optional<data::Batch> b = train_loader.next();
          if (!b) break;
          micro.push_back(std::move(*b));
        }
      }
      if (micro.empty()) break;
      const int64_t n_micro = static_cast<int64_t>(micro.size());
      int64_t step_samples = 0;  // over every rank (their shards have the same size)
      for (const data::Batch& b : micro) step_samples += b.x.shape()[0] * world;
      bool losses_read = !on_cuda;  // a point where the host knows the losses (CUDA: every loss_read_interval)
      step_opts.global_step = pos.global_step;
      if (on_cuda) {
        // Graphs need static shapes: full steps only (a short last step runs eagerly).
        const bool graphable = o_.cuda_graphs && n_micro == k && step_samples == k * lo.batch_size * world &&
                               pos.global_step - first_step_of_run >= StepGraph::kWarmupSteps && graph.fits(micro);
        const Tensor loss = graphable ? graph.run(model, task, opt, scaler, micro, step_opts)
                                      : train_step(model, task, opt, scaler, micro, step_opts).loss_tensor;
        // After every optimizer step, skipped ones too (the skip is the device's decision), as Ultralytics.
        if (ema) ema->update(model);
        losses_read = dev_losses->add(loss);
        if (losses_read && !take_device_losses()) {
          r.stopped_reason = nan.reason();
          ++pos.global_step;
          save({epoch, b_in_epoch + n_micro, pos.global_step});
          break;
        }
      } else {
        const StepResult sr = train_step(model, task, opt, scaler, micro, step_opts);
        if (!sr.backward_ran) {  // non-finite loss without a scaler: no (full) backward, no step
          if (!nan.observe(sr.loss, pos.global_step)) {
            r.stopped_reason = nan.reason();
            save({epoch, b_in_epoch, pos.global_step});
            break;
          }
        } else if (!sr.stepped) {
          ++r.overflow_events;
        }
        if (ema && sr.backward_ran) ema->update(model);
        r.losses.push_back(sr.loss);
        last_loss = sr.loss;
      }
      profiler::sample_memory();
      ++pos.global_step;
      if (!o_.memory_trace.empty()) memory::step(dev);  // a step boundary in the trace and the timeline
      b_in_epoch += n_micro;
      epoch_samples += step_samples;
      bar.update((b_in_epoch + k - 1) / k,
                 fmt::format("loss {:.4f} {:.0f} samples/s", last_loss,
                             static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
      const bool at_max = o_.max_steps >= 0 && pos.global_step >= o_.max_steps;
      // Ctrl-C reaches the ranks at different steps: they agree to stop together, where the host is free to
      // ask (every step on the CPU, at loss reads on CUDA, so a CUDA step never waits for the host).
      bool stop = stop_requested().load();
      if (dp) stop = losses_read && dp->any(stop);
      if (stop || at_max) {
        take_device_losses();
        const bool epoch_done = b_in_epoch >= batches_per_epoch;
        CheckpointPosition p{epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : b_in_epoch, pos.global_step};
        r.stopped_reason = nan.stopped() ? nan.reason() : at_max ? "max_steps" : "interrupted";
        r.interrupted = !at_max && !nan.stopped();
        save(p);
        break;
      }
    }
    // CUDA: the epoch's work is done only when its last losses arrive (this read waits for it).
    if (r.stopped_reason.empty() && !take_device_losses()) {
      r.stopped_reason = nan.reason();
      save({epoch + 1, 0, pos.global_step});
    }
    train_seconds += epoch_clock.seconds();
    samples += epoch_samples;
    r.final_train_loss = last_loss;
    if (!r.stopped_reason.empty()) {
      bar.finish(fmt::format("stopped: {}", r.stopped_reason));
      break;
    }
    // The epoch's checkpoint before its evaluation, which changes nothing the checkpoint holds (the evaluators draw
    // from generators of their own): a Ctrl-C during a long evaluation then loses nothing.
    save({epoch + 1, 0, pos.global_step});
    // A stop the step loop did not act on: CUDA data-parallel ranks vote only at loss reads, which an epoch shorter
    // than --loss-read-interval never reaches (the epoch-end read above is not one). The epoch is complete and
    // saved; no evaluation (the user wants out), as a stop during it would give none either.
    if (stop_agreed()) {
      ++r.epochs_completed;
      stop_interrupted();
      bar.finish("stopped: interrupted");
      break;
    }
    std::string eval_text;
    if (eval_loader) {
      std::optional<tasks::Metrics> m = run_eval();
      if (!m) {
        r.eval.clear();  // no metrics of an earlier epoch as the run's either
        ++r.epochs_completed;
        stop_interrupted();
        bar.finish("stopped: interrupted during the evaluation");
        break;
      }
      r.eval = std::move(*m);
      r.epoch_eval.push_back(r.eval);
      r.epoch_accuracy.push_back(metric_or_zero(r.eval, "accuracy"));
      for (const tasks::Metric& m : r.eval)
        eval_text += m.fraction ? fmt::format(", test {} {:.2f}%", m.name, 100.0 * m.value)
                                : fmt::format(", test {} {:.4f}", m.name, m.value);
    }
    ++r.epochs_completed;
    bar.finish(fmt::format("loss {:.4f}{}, {:.0f} samples/s", last_loss, eval_text,
                           static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
  }
  // Stopped by --max-steps before an epoch ended: evaluate once so the summary has the metrics. After
  // Ctrl-C the user wants out, and after a non-finite loss the model is not worth evaluating.
  if (r.epochs_completed == 0 && r.stopped_reason == "max_steps" && eval_loader) {
    if (std::optional<tasks::Metrics> m = run_eval())
      r.eval = std::move(*m);
    else
      stop_interrupted();
  }
  // Every rank ends with rank 0's BatchNorm statistics, so the ranks' models are identical.
  if (dp) broadcast_buffers(dp->comm(), model);
  r.test_accuracy = metric_or_zero(r.eval, "accuracy");
  r.test_loss = metric_or_zero(r.eval, "loss");
  if (prof) {
    auto data = std::make_shared<profiler::ProfileData>(prof->stop());
    if (!o_.trace.empty()) profiler::write_chrome_trace(*data, o_.trace);
    r.profile = std::move(data);
  }
  r.graph_nodes = graph.nodes();
  r.graph_kernels = graph.kernels();
  r.graph_steps = graph.replays();
  r.ema_updates = ema ? ema->updates() : 0;
  r.config_json = o_.config_json;
  r.steps = static_cast<int64_t>(r.losses.size());
  r.train_seconds = train_seconds;
  r.train_samples_per_sec = train_seconds > 0 ? static_cast<double>(samples) / train_seconds : 0;
  r.data_wait_seconds = train_loader.wait_seconds();
  if (on_cuda) r.host_syncs = static_cast<int64_t>(rt.host_sync_count() - syncs_before);
  r.wall_seconds = wall.seconds();
  if (!o_.memory_trace.empty()) memory::trace_stop(dev);
  if (auto st = memory::allocator_stats(dev)) {
    r.peak_memory_bytes = st->reserved.peak;
    r.memory_stats_json = memory::stats_to_json(*st).dump();
  } else {
    r.peak_memory_bytes = host_allocator_peak_bytes();
  }
  r.loss_scale = scaler.is_enabled() ? scaler.get_scale() : 0.0;
  r.skipped_steps = nan.skipped() + scaler.skipped_steps();
  if (on_cuda) r.overflow_events = scaler.skipped_steps();  // the device decided; counted there
  return r;
}

}  // namespace ampforge::train
