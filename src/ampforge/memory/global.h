// The process-wide allocator for CPU tensors, and the calls a training loop makes to it.
//
//   install_host_caching_allocator({.budget = 16 << 30});   // before the first tensor
//   memory::trace_start("run.memtrace");                     // optional: record every alloc/free
//   for (...) { ...; memory::step(); }                       // a step boundary: timeline + trace 's'
//   auto s = memory::allocator_stats();                      // AllocatorStats (std::nullopt if not installed)
//   memory::write_snapshot("snap.json");                     // for `ampforge memory report`
// Every call also takes a Device: memory::trace_start(path, Device(DeviceType::CUDA, 0)) records the
// caching allocator of cuda:0 (caching_allocator_for).
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
// The caching allocator currently installed (core's set_allocator) for a device type, or nullptr. For
// CUDA that is a router to one caching allocator per device: use caching_allocator_for(Device) instead.
CachingAllocator* installed_caching_allocator(DeviceType type = DeviceType::CPU);

// Caching allocators that a backend owns, one per device (CUDA: backends/cuda creates them on first use).
// The backend registers a resolver once (memory/ never depends on a backend); set_... returns the previous
// resolver, so a test can install its own and restore it.
using CachingAllocatorResolver = CachingAllocator* (*)(int device_index);
CachingAllocatorResolver set_caching_allocator_resolver(DeviceType type, CachingAllocatorResolver resolver);
// The caching allocator that serves tensors of `device`: for the CPU the installed host one, for other
// devices what the backend's resolver returns; nullptr when there is none.
CachingAllocator* caching_allocator_for(Device device);

// Stats of the caching allocator of a device; std::nullopt when it has none.
std::optional<AllocatorStats> allocator_stats(Device device);
// Trace and timeline of a device's caching allocator (`train --device cuda --memory-trace` records the CUDA
// allocator of the training device with these). They raise InvalidArgument when the device has none.
void trace_start(const std::string& path, Device device);
void trace_stop(Device device);
void step(Device device);
void write_snapshot(const std::string& path, Device device);
// The same for device 0 of a type (the CPU's installed allocator by default).
inline std::optional<AllocatorStats> allocator_stats(DeviceType type = DeviceType::CPU) {
  return allocator_stats(Device(type, 0));
}
inline void trace_start(const std::string& path, DeviceType type = DeviceType::CPU) { trace_start(path, Device(type, 0)); }
inline void trace_stop(DeviceType type = DeviceType::CPU) { trace_stop(Device(type, 0)); }
inline void step(DeviceType type = DeviceType::CPU) { step(Device(type, 0)); }
inline void write_snapshot(const std::string& path, DeviceType type = DeviceType::CPU) {
  write_snapshot(path, Device(type, 0));
}

}  // namespace ampforge::memory
