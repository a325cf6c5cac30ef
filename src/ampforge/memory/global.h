// The process-wide allocator for CPU tensors, and the calls a training loop makes to it.
//
//   install_host_caching_allocator({.budget = 16 << 30});   // before the first tensor
//   memory::trace_start("run.memtrace");                     // optional: record every alloc/free
//   for (...) { ...; memory::step(); }                       // a step boundary: timeline + trace 's'
//   auto s = memory::allocator_stats();                      // AllocatorStats (std::nullopt if not installed)
//   memory::write_snapshot("snap.json");                     // for `ampforge memory report`
//
// The installed allocator lives until the process ends (storages keep a pointer to their allocator and
// may outlive any scope), so uninstalling restores the previous allocator for new storages only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/stats.h"

namespace ampforge::memory {

struct HostAllocatorOptions {
  uint64_t budget = 0;  // bytes; 0: no budget (the machine's memory)
  PolicyConfig policy = PolicyConfig::ampforge();
};

// Installs a caching allocator over host memory (budgeted when options.budget > 0) as the CPU allocator
// (core's set_allocator). Installing again with the same options returns the same allocator; different
// options while one is installed are an InvalidArgument error.
CachingAllocator& install_host_caching_allocator(const HostAllocatorOptions& options = {});
// Restores the allocator that was installed before (for new storages). No-op when none is installed.
void uninstall_host_caching_allocator();
// The caching allocator currently installed for a device type, or nullptr.
CachingAllocator* installed_caching_allocator(DeviceType type = DeviceType::CPU);

// Stats of the installed caching allocator; std::nullopt when the device type has none.
std::optional<AllocatorStats> allocator_stats(DeviceType type = DeviceType::CPU);
// Trace and timeline of the installed allocator. These raise InvalidArgument when none is installed.
void trace_start(const std::string& path, DeviceType type = DeviceType::CPU);
void trace_stop(DeviceType type = DeviceType::CPU);
void step(DeviceType type = DeviceType::CPU);
void write_snapshot(const std::string& path, DeviceType type = DeviceType::CPU);

}  // namespace ampforge::memory
