// The probe of `ampforge memory fit` (fit_probe.h).
#include "ampforge/train/fit_probe.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "ampforge/amp/grad_scaler.h"
#include "ampforge/core/allocator.h"
#include "ampforge/core/runtime.h"
#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/train/step.h"
#include "ampforge/train/workload.h"
#include "ampforge/util/error.h"
#include "ampforge/util/timer.h"

namespace ampforge::train {

namespace {

// The memory one probe runs on. Heap-allocated: storages keep a pointer to their allocator, so if any
// tensor outlived the probe (none should), the allocator must outlive it too; it is then kept, not freed.
struct ProbeMemory {
  explicit ProbeMemory(size_t budget) : budgeted(host, budget), allocator(budgeted, memory::PolicyConfig::ampforge()) {}
  memory::HostProvider host;
  memory::BudgetedProvider budgeted;
  memory::CachingAllocator allocator;
};

// Makes `a` the CPU allocator for new storages while in scope.
class CpuAllocatorScope {
 public:
  explicit CpuAllocatorScope(Allocator* a) : previous_(set_allocator(DeviceType::CPU, a)) {}
  ~CpuAllocatorScope() { set_allocator(DeviceType::CPU, previous_); }
  CpuAllocatorScope(const CpuAllocatorScope&) = delete;
  CpuAllocatorScope& operator=(const CpuAllocatorScope&) = delete;

 private:
  Allocator* previous_;
};

// Bytes of the distinct storages behind `tensors` (views of one flat buffer count once; `seen` is shared
// across calls so that no storage is counted in two categories).
int64_t storage_bytes(const std::vector<Tensor>& tensors, std::set<const StorageImpl*>& seen) {
  int64_t n = 0;
  for (const Tensor& t : tensors)
    if (t.defined() && t.storage() && seen.insert(t.storage().get()).second)
      n += static_cast<int64_t>(t.storage()->nbytes());
  return n;
}

// Frees a probe's memory at the end of its scope, unless a tensor still uses it: then it is kept for the
// rest of the process (see ProbeMemory). Also on the way out of an unexpected exception.
class ProbeMemoryOwner {
 public:
  explicit ProbeMemoryOwner(size_t budget) : mem_(new ProbeMemory(budget)) {}
  ~ProbeMemoryOwner() {
    if (mem_->allocator.stats().allocated.current == 0) {
      delete mem_;
      return;
    }
    static std::mutex mu;
    static auto* kept = new std::vector<ProbeMemory*>;
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(mem_);
  }
  ProbeMemoryOwner(const ProbeMemoryOwner&) = delete;
  ProbeMemoryOwner& operator=(const ProbeMemoryOwner&) = delete;
  memory::CachingAllocator& allocator() { return mem_->allocator; }

 private:
  ProbeMemory* mem_;
};

// The steps of one probe on `s.device`, every tensor of the step coming from `alloc` (the CPU's or the meta
// device's caching allocator, installed by the caller). Fills p's measure; OutOfMemory makes it a failed probe.
void probe_steps(const FitProbeSetup& s, memory::FitProbe& p, memory::CachingAllocator& alloc) {
  const int64_t steps = p.full ? s.steps : 1;
  // The peaks while building (model, optimizer, batch), kept aside when the steps start: the allocator's peaks
  // are then reset so that the steps' own peak is known too (FitProbe::step_peak_allocated).
  std::optional<memory::AllocatorStats> built;
  {
    try {
      // The model at its registry input (or --image-size), its task and a synthetic batch of that shape, in
      // the layout the data loader produces; the same seed, so the same initial weights in every probe.
      train::WorkloadOptions wo;
      wo.batch = p.batch;
      wo.device = s.device;
      wo.image_size = s.image_size;
      wo.seq_len = s.seq_len;
      wo.channels_last = s.channels_last;
      wo.seed = s.cfg.seed;
      train::Workload w = train::make_workload(s.cfg.model, wo);
      nn::ModulePtr model = w.module;
      if (s.cfg.master_weights) model->to(s.cfg.precision);
      std::unique_ptr<optim::Optimizer> opt = train::make_optimizer(s.cfg, *model);
      amp::GradScaler scaler(train::grad_scaler_options(s.cfg.precision));
      tasks::Task& task = *w.task;
      const data::Batch micro[1] = {w.batch};
      const Tensor x = w.batch.x, y = w.batch.y;

      model->train();
      train::StepOptions so;
      so.precision = s.cfg.precision;
      so.recompute = s.cfg.recompute;
      int64_t before_forward = 0, activations = 0;
      so.after_forward = [&](const Tensor&) {
        activations = std::max(activations, alloc.stats().requested.current - before_forward);
      };
      built = alloc.stats();
      alloc.reset_peak_stats();
      for (int64_t i = 0; i < steps; ++i) {
        so.global_step = i;
        before_forward = alloc.stats().requested.current;
        train::train_step(*model, task, *opt, scaler, micro, so);
      }

      memory::FitMeasure& m = p.measure;
      std::set<const StorageImpl*> seen;
      std::vector<Tensor> params, grads, state;
      for (const auto& g : opt->param_groups()) {
        params.push_back(g.flat_params);
        grads.push_back(g.flat_grads);
        grads.push_back(g.master_grads);  // F16 groups: the F32 unscaled gradients
        grads.push_back(g.shard_grads);   // ZeRO-1: this rank's reduce-scattered part
        state.push_back(g.master);
      }
      for (auto& [name, t] : model->named_parameters()) params.push_back(t);  // any the optimizer does not hold
      for (auto& [name, t] : model->named_buffers()) params.push_back(t);
      for (auto& [name, t] : opt->state_dict()) {
        // Skip the step counters and learning rates: state_dict() makes those as fresh scalars.
        const bool scalar = name.ends_with(".step") || name.ends_with(".lr");
        if (!scalar) state.push_back(t);
      }
      m.parameters = storage_bytes(params, seen);
      m.gradients = storage_bytes(grads, seen);
      m.optimizer_state = storage_bytes(state, seen);
      m.inputs = storage_bytes({x, y}, seen);
      m.activations = activations;
      p.fits = true;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::OutOfMemory) throw;
      p.fits = false;
      p.oom_report = e.what();
    }
  }
  const memory::AllocatorStats st = alloc.stats();
  p.peak_live = std::max(st.requested.peak, built ? built->requested.peak : 0);
  p.peak_reserved = std::max(st.reserved.peak, built ? built->reserved.peak : 0);
  p.peak_allocated = std::max(st.allocated.peak, built ? built->allocated.peak : 0);
  p.step_peak_allocated = built ? st.allocated.peak : 0;
  p.measure.peak_live = p.peak_live;
  p.measure.peak_reserved = p.peak_reserved;
}

}  // namespace

// A fresh allocator per probe: each answer is what a fresh process sees, independent of the probes before it.
memory::FitProbe run_fit_probe(const FitProbeSetup& s, int64_t batch, bool full) {
  AF_CHECK(s.device.is_cpu() || s.device.is_meta(), "memory fit probes run on cpu or meta, not {}", s.device.str());
  AF_CHECK(s.budget > 0, "memory fit probe: the budget must be positive, got {}", s.budget);
  AF_CHECK(batch >= 1, "memory fit probe: the batch must be >= 1, got {}", batch);
  memory::FitProbe p;
  p.batch = batch;
  p.full = full;
  const Stopwatch clock;
  if (s.device.is_meta()) {
    // A fresh meta device with the budget as its capacity: the same policy as the real device, no memory.
    const auto session = runtime::plan_for(s.stands_for, static_cast<uint64_t>(s.budget));
    memory::CachingAllocator* planned = memory::caching_allocator_for(kMeta);  // the session's
    AF_ASSERT(planned != nullptr, "the meta device has no caching allocator in a planning session");
    probe_steps(s, p, *planned);
  } else {
    ProbeMemoryOwner mem(static_cast<size_t>(s.budget));
    CpuAllocatorScope scope(&mem.allocator());
    probe_steps(s, p, mem.allocator());
  }
  p.seconds = clock.seconds();
  return p;
}

}  // namespace ampforge::train
