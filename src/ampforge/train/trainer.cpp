#include "ampforge/train/trainer.h"

#include <cmath>
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
#include "ampforge/train/stop.h"
#include "ampforge/util/log.h"
#include "ampforge/util/thread_pool.h"
#include "ampforge/util/timer.h"

namespace ampforge::train {

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

// The library's check of its options, naming the fields (`ampforge train` checks its flags first, by their names:
// train/recipe.cpp).
void validate(const TrainerOptions& o) {
  AF_CHECK(o.epochs >= 1, "TrainerOptions::epochs must be >= 1, got {}", o.epochs);
  AF_CHECK(o.accumulate >= 1, "TrainerOptions::accumulate must be >= 1, got {}", o.accumulate);
  AF_CHECK(o.precision == DType::F32 || o.precision == DType::F16 || o.precision == DType::BF16,
           "TrainerOptions::precision must be F32, F16 or BF16, got {}", dtype_name(o.precision));
  AF_CHECK(!o.master_weights || o.precision != DType::F32,
           "TrainerOptions::master_weights needs precision F16 or BF16");
  AF_CHECK(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm),
           "TrainerOptions::clip_grad_norm must be >= 0, got {}", o.clip_grad_norm);
  AF_CHECK(o.loader.batch_size >= 1, "TrainerOptions::loader.batch_size must be >= 1, got {}", o.loader.batch_size);
  AF_CHECK(o.eval_loader.batch_size >= 1, "TrainerOptions::eval_loader.batch_size must be >= 1, got {}",
           o.eval_loader.batch_size);
  AF_CHECK(o.device.is_cpu() || o.device.is_cuda(), "TrainerOptions::device must be cpu or cuda:N, got '{}'",
           o.device.str());
  runtime::check_device_exists(o.device, "TrainerOptions::device " + o.device.str());
  AF_CHECK(!o.cuda_graphs || o.device.is_cuda(), "TrainerOptions::cuda_graphs needs a cuda device");
  AF_CHECK(o.loss_read_interval >= 1, "TrainerOptions::loss_read_interval must be >= 1, got {}", o.loss_read_interval);
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
  if (const std::string why = task_->model_mismatch(*model_); !why.empty()) AF_THROW(InvalidArgument, "{}", why);
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

namespace {

optim::ScheduleOptions run_schedule(const TrainerOptions& o, int64_t steps_per_epoch) {
  optim::ScheduleOptions so = o.schedule;
  if (so.total_steps <= 0) so.total_steps = steps_per_epoch * o.epochs;
  if (so.kind == optim::Schedule::Step && so.step_size <= 0)
    so.step_size = std::max<int64_t>(1, steps_per_epoch * std::max<int64_t>(1, o.epochs / 3));
  return so;
}

// The run's memory accounting, begun before anything of the run allocates (the data loaders included): the peak of
// the host's caching allocator and of the training device's (the CUDA caching allocator when training there) are
// reset, and the memory trace starts.
struct MemoryAccounting {
  MemoryAccounting(const TrainerOptions& o, Device dev) {
    if (auto* ca = memory::installed_caching_allocator()) ca->reset_peak_stats();
    if (dev.is_cuda())
      if (auto* ca = memory::caching_allocator_for(dev)) ca->reset_peak_stats();
    if (!o.memory_trace.empty()) memory::trace_start(o.memory_trace, dev);
  }
};

data::LoaderOptions on_device(data::LoaderOptions lo, Device dev) {
  lo.device = dev;
  return lo;
}

// One fit(): the run's state and its parts (set-up, resume, an epoch, a step, evaluation, checkpoint, finish). Every
// device takes the same path; where they differ is how a step's loss reaches the host: on the CPU after every step,
// on CUDA in blocks (train/device_losses.h), so that a CUDA step never waits for the host.
class FitRun {
 public:
  FitRun(nn::Module& model, tasks::Task& task, optim::Optimizer& opt, DataParallel* dp, const TrainerOptions& o,
         std::shared_ptr<const data::Dataset> train_data, std::shared_ptr<const data::Dataset> eval_data)
      : model_(model), task_(task), opt_(opt), dp_(dp), o_(o), dev_(o.device), on_cuda_(dev_.is_cuda()),
        world_(dp ? dp->comm().size() : 1), rank_(dp ? dp->comm().rank() : 0), accounting_(o, dev_),
        train_loader_(std::move(train_data), sharded(on_device(o.loader, dev_))),
        k_(o.accumulate), batches_per_epoch_(train_loader_.num_batches()),
        steps_per_epoch_((batches_per_epoch_ + k_ - 1) / k_), sched_(opt, run_schedule(o, steps_per_epoch_)),
        // Loss scaling is needed for F16 (narrow exponent); BF16 has F32's range, as in PyTorch's recipes.
        scaler_(grad_scaler_options(o.precision)), nan_(o.nan_policy, scaler_.is_enabled()),
        label_(o.checkpoint_label.empty() ? model.type_name() : o.checkpoint_label), rt_(runtime::device_runtime(dev_)) {
    if (eval_data) {
      data::LoaderOptions elo = on_device(o.eval_loader, dev_);
      elo.shuffle = false;
      eval_loader_.emplace(std::move(eval_data), elo);
    }
  }

  TrainResult run() {
    start();
    // A stop asked for before training started (a Ctrl-C while the data was prepared): no step runs, nothing is
    // saved. The flag is not cleared: a stop signal ends the process's training (a library caller that wants to
    // train again after one clears stop_requested() itself).
    if (stop_agreed()) stop_interrupted();
    const TrainingScope training_scope;
    model_.train();
    for (int64_t epoch = pos_.epoch; epoch < o_.epochs && r_.stopped_reason.empty(); ++epoch)
      if (!run_epoch(epoch)) break;
    // Stopped by --max-steps before an epoch ended: evaluate once so the summary has the metrics. After Ctrl-C the
    // user wants out, and after a non-finite loss the model is not worth evaluating.
    if (r_.epochs_completed == 0 && r_.stopped_reason == "max_steps" && eval_loader_) {
      if (std::optional<tasks::Metrics> m = evaluate_and_share())
        r_.eval = std::move(*m);
      else
        stop_interrupted();
    }
    return finish();
  }

 private:
  data::LoaderOptions sharded(data::LoaderOptions lo) const {
    lo.shard_rank = rank_;
    lo.shard_count = world_;
    return lo;
  }

  // The result's header, weight average, resume, the step's options, the profiler; the header line.
  void start() {
    r_.precision = precision_name(o_.precision);
    r_.device = dev_.str();
    r_.task = task_.name();
    r_.primary_metric = task_.primary_metric();
    r_.parameters = model_.num_parameters();
    r_.world_size = world_;
    r_.rank = rank_;
    if (o_.ema.enabled) ema_.emplace(model_, o_.ema);
    if (!o_.resume.empty()) resume();
    if (!o_.save.empty()) check_checkpoint_path(o_.save);
    if (o_.verbose) print_header();
    step_opts_.precision = o_.precision;
    step_opts_.clip_grad_norm = o_.clip_grad_norm;
    step_opts_.sum_micro_batches = o_.accumulate_sum;
    step_opts_.recompute = o_.recompute;
    step_opts_.schedule = &sched_;
    step_opts_.read_loss = !on_cuda_;  // CUDA: every decision stays on the device, losses are read in blocks
    step_opts_.data_parallel = dp_;
    // Every epoch end reads the losses too, so a block never holds more than an epoch's steps: a huge interval
    // (read only at epoch ends) allocates no more device memory than that.
    if (on_cuda_) dev_losses_.emplace(dev_, std::min(o_.loss_read_interval, std::max<int64_t>(steps_per_epoch_, 1)));
    syncs_before_ = rt_.host_sync_count();
    if (o_.profile || !o_.trace.empty()) {
      if (!o_.profile_steps.empty()) prof_steps_ = parse_profile_steps(o_.profile_steps);
      prof_ = std::make_unique<profiler::Session>(profiler::SessionOptions{.memory_device = dev_});
    }
    first_step_of_run_ = pos_.global_step;
    micro_.reserve(static_cast<size_t>(k_));
  }

  void resume() {
    CheckpointInfo info = load_checkpoint(o_.resume, model_, opt_, label_);
    pos_ = info.pos;
    if (ema_ && !info.ema.empty()) {
      ema_->load(info.ema, info.ema_updates);
    } else if (ema_) {
      ema_.emplace(model_, o_.ema);  // from the resumed weights
      if (o_.verbose) log(LogLevel::Warn, "'{}' has no weight average: the average starts from its weights", o_.resume);
    } else if (!info.ema.empty() && o_.verbose) {
      log(LogLevel::Warn, "'{}' has a weight average, which this run (no EMA) drops", o_.resume);
    }
    default_generator().set_state(info.rng);
    if (scaler_.is_enabled() && !info.scaler.empty()) scaler_.load_state_dict(info.scaler);
    if (o_.verbose)
      log(LogLevel::Warn, "resumed from '{}' at epoch {}, step {}", o_.resume, pos_.epoch + 1, pos_.global_step);
  }

  void print_header() const {
    const std::string parallel =
        dp_ ? fmt::format(", data parallel: {} ranks ({}, {}), global batch {}", world_, dp_->comm().backend(),
                          dp_->zero_stage() == 1 ? std::string("ZeRO-1: optimizer state sharded")
                                                 : fmt::format("{} gradient buckets{}", dp_->buckets().size(),
                                                               o_.data_parallel.overlap ? " started from backward" : ""),
                          o_.loader.batch_size * world_ * k_)
            : "";
    std::fprintf(stderr, "ampforge train: %s (%lld parameters), %s, %lld epochs x %lld steps, batch %lld%s, %s, %s, "
                 "%d threads%s%s%s\n", label_.c_str(), static_cast<long long>(r_.parameters), task_.name().c_str(),
                 static_cast<long long>(o_.epochs), static_cast<long long>(steps_per_epoch_),
                 static_cast<long long>(o_.loader.batch_size), k_ > 1 ? fmt::format(" x {} accumulated", k_).c_str() : "",
                 opt_.name(), r_.precision.c_str(), get_num_threads(), on_cuda_ ? (", device " + r_.device).c_str() : "",
                 o_.cuda_graphs ? ", CUDA graphs" : "", parallel.c_str());
    // What the device does with this precision that the user would not guess (BF16 on a CPU without fast BF16).
    if (const std::string note = rt_.precision_note(o_.precision); !note.empty())
      std::fprintf(stderr, "note: %s\n", note.c_str());
  }

  // Whether a stop was asked for, the same answer on every rank (a collective: all ranks ask at the same point).
  bool stop_agreed() {
    const bool stop = stop_requested().load();
    return dp_ ? dp_->any(stop) : stop;
  }
  void stop_interrupted() {
    r_.stopped_reason = "interrupted";
    r_.interrupted = true;
  }

  // Rank 0 alone evaluates in a data-parallel run; the others receive its metrics (not its details). With a weight
  // average, on it. None when a stop came during it (evaluate() then stops early, and metrics of part of the split
  // are not reported).
  std::optional<tasks::Metrics> evaluate_and_share() {
    tasks::Metrics m;
    if (rank_ == 0) {
      // The weight average is swapped in and the model's own weights written back: the same values, so F32
      // masters (--master-weights) stay as they are instead of restarting from the 16-bit parameters.
      const std::vector<char> masters = ema_ ? opt_.masters_in_sync() : std::vector<char>{};
      m = evaluate(model_, task_, *eval_loader_, o_.precision, ema_ ? &*ema_ : nullptr, r_.eval_details);
      if (ema_) opt_.keep_masters_after_restore(masters);
    }
    if (dp_) {
      // The other ranks wait here for as long as rank 0 evaluates, which no limit meant for a hung rank bounds
      // (--collective-timeout; a rank 0 that dies meanwhile ends the job through the launcher).
      const dist::ScopedCollectiveTimeout while_rank0_evaluates(dp_->comm(), 0);
      m = broadcast_metrics(dp_->comm(), m);
    }
    if (stop_agreed()) return std::nullopt;
    return m;
  }

  void save(const CheckpointPosition& p) {
    if (o_.save.empty()) return;
    r_.checkpoint = o_.save;
    // Sharded optimizer state is gathered from every rank (all call this); rank 0 writes the job's checkpoint.
    const auto opt_state = dp_ ? dp_->optimizer_state() : opt_.state_dict();
    // Every rank's work so far, the collectives included, has completed before rank 0 reads the state: a
    // communicator that failed meanwhile (a rank stopped taking part: NCCL's watchdog aborted it, and the
    // gradients since are garbage) throws here instead of a checkpoint overwriting the last good one.
    if (dp_) dp_->comm().barrier();
    if (rank_ != 0) return;
    CheckpointInfo info;
    info.model = label_;
    info.pos = p;
    info.rng = default_generator().state();
    info.scaler = scaler_.state_dict();
    info.config_json = o_.config_json;
    info.record = o_.model_record;
    if (ema_) {
      info.ema = ema_->full_state_dict(model_);
      info.ema_updates = ema_->updates();
    }
    CheckpointWriteScope whole_file;
    save_checkpoint(o_.save, model_, opt_, opt_state, info);
  }

  // Takes the losses read from the device, in step order, through the NaN policy (without a scaler the device
  // already skipped those optimizer steps). Returns false when training must stop. Nothing to do on the CPU.
  bool take_device_losses() {
    if (!dev_losses_) return true;
    profiler::Range sync_range("loss read", profiler::RangeKind::Sync);
    for (double lv : dev_losses_->read()) {
      const int64_t step = first_step_of_run_ + static_cast<int64_t>(r_.losses.size());
      r_.losses.push_back(lv);
      last_loss_ = lv;
      nan_.observe(lv, step, pos_.global_step);
    }
    return !nan_.stopped();
  }

  void profile_window(int64_t step) {  // open or close the profiled window at a step boundary
    if (!prof_) return;
    if (step >= prof_steps_.first && (prof_steps_.second < 0 || step < prof_steps_.second)) prof_->start();
    else prof_->pause();
  }

  // The next optimizer step's micro-batches (fewer than k_ at the end of an epoch; none after it).
  void next_micro_batches() {
    profiler::Range data_range("data", profiler::RangeKind::DataWait);
    micro_.clear();
    while (static_cast<int64_t>(micro_.size()) < k_) {
      std::optional<data::Batch> b = train_loader_.next();
      if (!b) break;
      micro_.push_back(std::move(*b));
    }
  }

  // One optimizer step over micro_, the loss kept on the device. Returns where a stop leaves the run (the NaN policy
  // stopped it at a loss read: r_.stopped_reason is set), or nullopt. losses_read: whether the host knows the losses
  // now.
  std::optional<CheckpointPosition> device_step(int64_t epoch, int64_t b_in_epoch, int64_t step_samples,
                                                bool& losses_read) {
    const int64_t n_micro = static_cast<int64_t>(micro_.size());
    // Graphs need static shapes: full steps only (a short last step runs eagerly).
    const bool graphable = o_.cuda_graphs && n_micro == k_ && step_samples == k_ * o_.loader.batch_size * world_ &&
                           pos_.global_step - first_step_of_run_ >= StepGraph::kWarmupSteps && graph_.fits(micro_);
    const Tensor loss = graphable ? graph_.run(model_, task_, opt_, scaler_, micro_, step_opts_)
                                  : train_step(model_, task_, opt_, scaler_, micro_, step_opts_).loss_tensor;
    // After every optimizer step, skipped ones too (the skip is the device's decision), as Ultralytics.
    if (ema_) ema_->update(model_);
    losses_read = dev_losses_->add(loss);
    if (losses_read && !take_device_losses()) {
      r_.stopped_reason = nan_.reason();
      return CheckpointPosition{epoch, b_in_epoch + n_micro, pos_.global_step + 1};
    }
    return std::nullopt;
  }

  // One optimizer step over micro_, the loss read after it (as device_step).
  std::optional<CheckpointPosition> host_step(int64_t epoch, int64_t b_in_epoch) {
    const StepResult sr = train_step(model_, task_, opt_, scaler_, micro_, step_opts_);
    if (!sr.backward_ran) {  // non-finite loss without a scaler: no (full) backward, no step
      if (!nan_.observe(sr.loss, pos_.global_step)) {
        r_.stopped_reason = nan_.reason();
        return CheckpointPosition{epoch, b_in_epoch, pos_.global_step};
      }
    } else if (!sr.stepped) {
      ++r_.overflow_events;
    }
    if (ema_ && sr.backward_ran) ema_->update(model_);
    r_.losses.push_back(sr.loss);
    last_loss_ = sr.loss;
    return std::nullopt;
  }

  // One epoch: its steps, its checkpoint and its evaluation. Returns false when training stops.
  bool run_epoch(int64_t epoch) {
    const int64_t skip = epoch == pos_.epoch ? pos_.batch_in_epoch : 0;  // batches (micro-batches) done
    train_loader_.start_epoch(epoch, skip);
    Progress bar(fmt::format("epoch {}/{}", epoch + 1, o_.epochs), steps_per_epoch_, o_.progress);
    const Stopwatch epoch_clock;
    int64_t epoch_samples = 0;
    int64_t b_in_epoch = skip;
    while (r_.stopped_reason.empty()) {
      profile_window(pos_.global_step);
      const bool in_epoch = b_in_epoch < batches_per_epoch_;  // else next() ends the epoch: not a step
      profiler::Range step_range(in_epoch ? "step" : "epoch end",
                                 in_epoch ? profiler::RangeKind::Step : profiler::RangeKind::User);
      next_micro_batches();
      if (micro_.empty()) break;
      const int64_t n_micro = static_cast<int64_t>(micro_.size());
      int64_t step_samples = 0;  // over every rank (their shards have the same size)
      for (const data::Batch& b : micro_) step_samples += b.x.shape()[0] * world_;
      bool losses_read = !on_cuda_;  // a point where the host knows the losses (CUDA: every loss_read_interval)
      step_opts_.global_step = pos_.global_step;
      if (std::optional<CheckpointPosition> stop_at = on_cuda_ ? device_step(epoch, b_in_epoch, step_samples, losses_read)
                                                               : host_step(epoch, b_in_epoch)) {
        pos_.global_step = stop_at->global_step;
        save(*stop_at);
        break;
      }
      profiler::sample_memory();
      ++pos_.global_step;
      if (!o_.memory_trace.empty()) memory::step(dev_);  // a step boundary in the trace and the timeline
      b_in_epoch += n_micro;
      epoch_samples += step_samples;
      bar.update((b_in_epoch + k_ - 1) / k_,
                 fmt::format("loss {:.4f} {:.0f} samples/s", last_loss_,
                             static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
      if (stop_after_step(epoch, b_in_epoch, losses_read)) break;
    }
    return end_epoch(epoch, bar, epoch_clock, epoch_samples);
  }

  // --max-steps reached or a stop asked for after a step: sets the reason and saves. Ctrl-C reaches the ranks at
  // different steps: they agree to stop together, where the host is free to ask (every step on the CPU, at loss
  // reads on CUDA, so a CUDA step never waits for the host).
  bool stop_after_step(int64_t epoch, int64_t b_in_epoch, bool losses_read) {
    const bool at_max = o_.max_steps >= 0 && pos_.global_step >= o_.max_steps;
    bool stop = stop_requested().load();
    if (dp_) stop = losses_read && dp_->any(stop);
    if (!stop && !at_max) return false;
    take_device_losses();
    const bool epoch_done = b_in_epoch >= batches_per_epoch_;
    const CheckpointPosition p{epoch_done ? epoch + 1 : epoch, epoch_done ? 0 : b_in_epoch, pos_.global_step};
    r_.stopped_reason = nan_.stopped() ? nan_.reason() : at_max ? "max_steps" : "interrupted";
    r_.interrupted = !at_max && !nan_.stopped();
    save(p);
    return true;
  }

  // The end of an epoch's steps: its last losses, its checkpoint, its evaluation and its line. Returns false when
  // training stops.
  bool end_epoch(int64_t epoch, Progress& bar, const Stopwatch& epoch_clock, int64_t epoch_samples) {
    // CUDA: the epoch's work is done only when its last losses arrive (this read waits for it).
    if (r_.stopped_reason.empty() && !take_device_losses()) {
      r_.stopped_reason = nan_.reason();
      save({epoch + 1, 0, pos_.global_step});
    }
    train_seconds_ += epoch_clock.seconds();
    samples_ += epoch_samples;
    r_.final_train_loss = last_loss_;
    if (!r_.stopped_reason.empty()) {
      bar.finish(fmt::format("stopped: {}", r_.stopped_reason));
      return false;
    }
    // The epoch's checkpoint before its evaluation, which changes nothing the checkpoint holds (the evaluators draw
    // from generators of their own): a Ctrl-C during a long evaluation then loses nothing.
    save({epoch + 1, 0, pos_.global_step});
    // A stop the step loop did not act on: CUDA data-parallel ranks vote only at loss reads, which an epoch shorter
    // than --loss-read-interval never reaches (the epoch-end read above is not one). The epoch is complete and
    // saved; no evaluation (the user wants out), as a stop during it would give none either.
    if (stop_agreed()) {
      ++r_.epochs_completed;
      stop_interrupted();
      bar.finish("stopped: interrupted");
      return false;
    }
    std::string eval_text;
    if (eval_loader_) {
      std::optional<tasks::Metrics> m = evaluate_and_share();
      if (!m) {
        r_.eval.clear();  // no metrics of an earlier epoch as the run's either
        ++r_.epochs_completed;
        stop_interrupted();
        bar.finish("stopped: interrupted during the evaluation");
        return false;
      }
      r_.eval = std::move(*m);
      r_.epoch_eval.push_back(r_.eval);
      r_.epoch_accuracy.push_back(metric_or_zero(r_.eval, "accuracy"));
      for (const tasks::Metric& x : r_.eval)
        eval_text += x.fraction ? fmt::format(", test {} {:.2f}%", x.name, 100.0 * x.value)
                                : fmt::format(", test {} {:.4f}", x.name, x.value);
    }
    ++r_.epochs_completed;
    bar.finish(fmt::format("loss {:.4f}{}, {:.0f} samples/s", last_loss_, eval_text,
                           static_cast<double>(epoch_samples) / std::max(epoch_clock.seconds(), 1e-9)));
    return true;
  }

  // The result's totals: metrics, profile, graphs, speed, memory, loss scaling.
  TrainResult finish() {
    // Every rank ends with rank 0's BatchNorm statistics, so the ranks' models are identical.
    if (dp_) broadcast_buffers(dp_->comm(), model_);
    r_.test_accuracy = metric_or_zero(r_.eval, "accuracy");
    r_.test_loss = metric_or_zero(r_.eval, "loss");
    if (prof_) {
      auto data = std::make_shared<profiler::ProfileData>(prof_->stop());
      if (!o_.trace.empty()) profiler::write_chrome_trace(*data, o_.trace);
      r_.profile = std::move(data);
    }
    r_.graph_nodes = graph_.nodes();
    r_.graph_kernels = graph_.kernels();
    r_.graph_steps = graph_.replays();
    r_.ema_updates = ema_ ? ema_->updates() : 0;
    r_.config_json = o_.config_json;
    r_.steps = static_cast<int64_t>(r_.losses.size());
    r_.train_seconds = train_seconds_;
    r_.train_samples_per_sec = train_seconds_ > 0 ? static_cast<double>(samples_) / train_seconds_ : 0;
    r_.data_wait_seconds = train_loader_.wait_seconds();
    if (on_cuda_) r_.host_syncs = static_cast<int64_t>(rt_.host_sync_count() - syncs_before_);
    r_.wall_seconds = wall_.seconds();
    if (!o_.memory_trace.empty()) memory::trace_stop(dev_);
    if (auto st = memory::allocator_stats(dev_)) {
      r_.peak_memory_bytes = st->reserved.peak;
      r_.memory_stats_json = memory::stats_to_json(*st).dump();
    } else {
      r_.peak_memory_bytes = host_allocator_peak_bytes();
    }
    r_.loss_scale = scaler_.is_enabled() ? scaler_.get_scale() : 0.0;
    r_.skipped_steps = nan_.skipped() + scaler_.skipped_steps();
    if (on_cuda_) r_.overflow_events = scaler_.skipped_steps();  // the device decided; counted there
    return std::move(r_);
  }

  nn::Module& model_;
  tasks::Task& task_;
  optim::Optimizer& opt_;
  DataParallel* dp_;
  const TrainerOptions& o_;
  const Device dev_;
  const bool on_cuda_;
  const int world_, rank_;
  const Stopwatch wall_;
  const MemoryAccounting accounting_;
  data::DataLoader train_loader_;
  std::optional<data::DataLoader> eval_loader_;
  const int64_t k_, batches_per_epoch_, steps_per_epoch_;
  optim::LRScheduler sched_;
  amp::GradScaler scaler_;
  NanGuard nan_;
  const std::string label_;
  runtime::DeviceRuntime& rt_;
  TrainResult r_;
  std::optional<ModelEma> ema_;
  CheckpointPosition pos_;
  StepOptions step_opts_;
  std::optional<DeviceLosses> dev_losses_;
  StepGraph graph_;
  uint64_t syncs_before_ = 0;
  std::unique_ptr<profiler::Session> prof_;
  std::pair<int64_t, int64_t> prof_steps_{0, -1};
  int64_t samples_ = 0;
  double train_seconds_ = 0;
  double last_loss_ = 0;
  int64_t first_step_of_run_ = 0;
  std::vector<data::Batch> micro_;
};

}  // namespace

TrainResult Trainer::fit(std::shared_ptr<const data::Dataset> train_data,
                         std::shared_ptr<const data::Dataset> eval_data) {
  AF_CHECK(!used_, "Trainer::fit can run once per Trainer (make a new one to train again)");
  used_ = true;
  AF_CHECK(train_data != nullptr, "Trainer::fit: no training data");
  FitRun run(*model_, *task_, *opt_, dp_.get(), o_, std::move(train_data), std::move(eval_data));
  return run.run();
}

}  // namespace ampforge::train
