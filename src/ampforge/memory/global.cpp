#include "ampforge/memory/global.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "ampforge/memory/budgeted_provider.h"
#include "ampforge/memory/host_provider.h"
#include "ampforge/util/error.h"

namespace ampforge::memory {

namespace {

// Everything the installed host allocator needs, kept alive for the rest of the process.
struct HostInstall {
  HostAllocatorOptions options;
  HostProvider host;
  std::unique_ptr<BudgetedProvider> budgeted;
  std::unique_ptr<CachingAllocator> allocator;
  Allocator* previous = nullptr;
  bool active = false;
};

std::mutex g_mu;
HostInstall* g_host = nullptr;  // the latest install
// Every install ever made, never deleted: storages may outlive every scope (see global.h). Reachable from
// here, so leak checkers do not count them.
std::vector<HostInstall*>* g_all = new std::vector<HostInstall*>;

bool same_options(const HostAllocatorOptions& a, const HostAllocatorOptions& b) {
  return a.budget == b.budget && a.policy.name == b.policy.name &&
         a.policy.expandable_segments == b.policy.expandable_segments && a.policy.cache == b.policy.cache;
}

std::atomic<CachingAllocatorResolver> g_resolvers[kNumDeviceTypes] = {};

CachingAllocator& require(Device device) {
  CachingAllocator* a = caching_allocator_for(device);
  if (a == nullptr && device.is_cpu())
    AF_THROW(InvalidArgument, "no caching allocator is installed for cpu; call install_host_caching_allocator() first");
  AF_CHECK(a != nullptr, "{} has no caching allocator (is the device available in this build and on this machine?)",
           device.str());
  return *a;
}

}  // namespace

CachingAllocator& install_host_caching_allocator(const HostAllocatorOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_host != nullptr && g_host->active) {
    AF_CHECK(same_options(g_host->options, options),
             "a host caching allocator is already installed with other options (policy '{}', budget {}); "
             "uninstall it first",
             g_host->options.policy.name, g_host->options.budget);
    return *g_host->allocator;
  }
  // A previous install stays alive (its storages may still exist); a new one gets fresh state.
  auto* inst = new HostInstall;
  inst->options = options;
  Provider* p = &inst->host;
  if (options.budget > 0) {
    inst->budgeted = std::make_unique<BudgetedProvider>(inst->host, options.budget);
    p = inst->budgeted.get();
  }
  inst->allocator = std::make_unique<CachingAllocator>(*p, options.policy);
  inst->previous = set_allocator(DeviceType::CPU, inst->allocator.get());
  inst->active = true;
  g_host = inst;
  g_all->push_back(inst);
  return *inst->allocator;
}

void uninstall_host_caching_allocator() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_host == nullptr || !g_host->active) return;
  set_allocator(DeviceType::CPU, g_host->previous);
  g_host->active = false;
}

CachingAllocator* installed_caching_allocator(DeviceType type) {
  return dynamic_cast<CachingAllocator*>(get_allocator(type));
}

CachingAllocatorResolver set_caching_allocator_resolver(DeviceType type, CachingAllocatorResolver resolver) {
  return g_resolvers[static_cast<int>(type)].exchange(resolver);
}

CachingAllocator* caching_allocator_for(Device device) {
  if (device.is_cpu()) return installed_caching_allocator(DeviceType::CPU);
  const CachingAllocatorResolver r = g_resolvers[static_cast<int>(device.type)].load();
  return r != nullptr ? r(device.index) : nullptr;
}

std::optional<AllocatorStats> allocator_stats(Device device) {
  CachingAllocator* a = caching_allocator_for(device);
  if (a == nullptr) return std::nullopt;
  return a->stats();
}

void trace_start(const std::string& path, Device device) { require(device).trace_start(path); }
void trace_stop(Device device) { require(device).trace_stop(); }
void step(Device device) { require(device).step(); }
void write_snapshot(const std::string& path, Device device) { require(device).write_snapshot(path); }

}  // namespace ampforge::memory
