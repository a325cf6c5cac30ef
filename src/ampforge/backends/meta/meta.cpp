// Meta sessions: the caching allocator behind meta tensors and what the meta device stands for (meta.h).
#include "ampforge/backends/meta/meta.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "ampforge/core/allocator.h"
#include "ampforge/core/dispatch.h"
#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/global.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"

namespace ampforge::meta {

struct MetaSession::State {
  explicit State(const MetaOptions& o)
      : options(o),
        simulated(o.granule, kMeta, o.expandable_segments),
        budgeted(o.capacity > 0 ? std::make_unique<memory::BudgetedProvider>(simulated, o.capacity) : nullptr),
        allocator(budgeted ? static_cast<memory::Provider&>(*budgeted) : simulated, policy(o)) {}

  static memory::PolicyConfig policy(const MetaOptions& o) {
    memory::PolicyConfig p = memory::PolicyConfig::ampforge();
    p.expandable_segments = o.expandable_segments;
    return p;
  }

  MetaOptions options;
  memory::SimulatedProvider simulated;
  std::unique_ptr<memory::BudgetedProvider> budgeted;
  memory::CachingAllocator allocator;
  void* blas_workspace = nullptr;  // CUDA target: the cuBLASLt workspace, once a matmul ran
};

namespace {

std::mutex g_mu;
std::atomic<MetaSession::State*> g_current{nullptr};

// The state used without a session: CPU rules, no limit. Never destroyed (tensors may outlive everything).
MetaSession::State* default_state() {
  static auto* s = new MetaSession::State(MetaOptions::stand_for(DeviceType::CPU));
  return s;
}

MetaSession::State* current_state() {
  MetaSession::State* s = g_current.load(std::memory_order_acquire);
  return s != nullptr ? s : default_state();
}

// States whose allocator still had live blocks when their session ended; reachable, so never reported as leaks.
std::vector<MetaSession::State*>* g_kept = new std::vector<MetaSession::State*>;

}  // namespace

MetaOptions MetaOptions::stand_for(DeviceType target, uint64_t capacity) {
  AF_CHECK(target == DeviceType::CPU || target == DeviceType::CUDA,
           "the meta device stands for cpu or cuda, not {}", device_type_name(target));
  MetaOptions o;
  o.target = target;
  o.capacity = capacity;
  // The CUDA backend's choice (backends/cuda/runtime.cpp): cudaMalloc unless the variable asks for virtual memory.
  o.expandable_segments = target == DeviceType::CPU || env_flag("AMPFORGE_CUDA_EXPANDABLE_SEGMENTS", false);
  return o;
}

MetaSession::MetaSession(const MetaOptions& options) {
  AF_CHECK(options.target == DeviceType::CPU || options.target == DeviceType::CUDA,
           "MetaSession: the meta device stands for cpu or cuda, not {}", device_type_name(options.target));
  ensure_backends_registered();  // the meta kernels and the resolver below
  std::lock_guard<std::mutex> lock(g_mu);
  state_ = new State(options);
  previous_ = g_current.exchange(state_, std::memory_order_acq_rel);
  set_allocator(DeviceType::Meta, &state_->allocator);
}

MetaSession::~MetaSession() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (state_->blas_workspace != nullptr) state_->allocator.free(state_->blas_workspace);
  g_current.store(previous_, std::memory_order_release);
  set_allocator(DeviceType::Meta, &(previous_ != nullptr ? previous_ : default_state())->allocator);
  if (state_->allocator.stats().allocated.current == 0)
    delete state_;
  else
    g_kept->push_back(state_);
}

memory::CachingAllocator& MetaSession::allocator() { return state_->allocator; }
const MetaOptions& MetaSession::options() const { return state_->options; }

DeviceType target() { return current_state()->options.target; }

memory::CachingAllocator& current_allocator() { return current_state()->allocator; }

MetaScratch::MetaScratch(size_t bytes) : allocator_(&current_allocator()), bytes_(bytes) {
  if (bytes > 0) ptr_ = allocator_->allocate(bytes, kMeta);
}

MetaScratch::~MetaScratch() {
  if (ptr_ != nullptr) allocator_->deallocate(ptr_, bytes_, kMeta);
}

void ensure_blas_workspace() {
  MetaSession::State* s = current_state();
  if (s->options.target != DeviceType::CUDA || s->blas_workspace != nullptr) return;
  s->blas_workspace = s->allocator.allocate(kCublasLtWorkspaceBytes, kMeta);
}

namespace detail {

// Called once by register_meta_backend(): the default allocator and the resolver of memory/global.h.
void install_default_allocator() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (get_allocator(DeviceType::Meta) == nullptr) set_allocator(DeviceType::Meta, &current_state()->allocator);
  memory::set_caching_allocator_resolver(DeviceType::Meta, [](int) { return &current_allocator(); });
}

}  // namespace detail

}  // namespace ampforge::meta
