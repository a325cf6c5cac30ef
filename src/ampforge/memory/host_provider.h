// Host providers.
//   HostProvider       real memory. Plain segments from aligned_alloc; virtual memory on Linux with
//                      mmap(PROT_NONE) to reserve and mprotect(READ|WRITE) to map a granule. A host
//                      "physical granule" is the pages a handle owns: unmap() only makes them inaccessible
//                      (mprotect(PROT_NONE), pages kept), map() of a handle whose pages sit elsewhere moves
//                      them to the new address with mremap(MREMAP_FIXED | MREMAP_DONTUNMAP), and
//                      release_physical() gives them back to the kernel (madvise(MADV_DONTNEED)). So, as with
//                      CUDA's handles, the data follows the handle, and, what matters on the CPU, the kernel
//                      does not zero the granule again: when the policy re-maps idle granules for a new
//                      block (every training step does), faulting in fresh pages cleared 2 MiB per granule
//                      and took a quarter of a ResNet-50 step's CPU time. Kernels without MREMAP_DONTUNMAP
//                      (before Linux 5.7) fall back to fresh pages.
//   SimulatedProvider  address space only: unique, aligned addresses that must never be dereferenced. For
//                      replaying traces, for simulations of a large card on a small machine (wrap it in
//                      a BudgetedProvider to give it a capacity) and for the meta device. Without virtual
//                      memory (virtual_memory = false) it offers plain segments only, as cudaMalloc does.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "ampforge/memory/provider.h"

namespace ampforge::memory {

class HostProvider final : public Provider {
 public:
  explicit HostProvider(size_t granule = kHostGranule);
  const char* name() const override { return "host"; }
  Device device() const override { return kCPU; }
  size_t granularity() const override { return granule_; }
  size_t capacity() const override;  // physical RAM of the machine

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;

  bool supports_virtual() const override;
  void* reserve(size_t bytes) override;
  void unreserve(void* base, size_t bytes) noexcept override;
  std::optional<uint64_t> create_physical() override;
  void release_physical(uint64_t handle) noexcept override;
  void map(void* addr, uint64_t handle) override;
  void unmap(void* addr) noexcept override;

  // Granules whose pages were moved rather than faulted in again (for tests and reports).
  uint64_t pages_moved() const;

 private:
  size_t granule_;
  mutable std::mutex mu_;                            // the maps below; providers may be shared by allocators
  uint64_t next_handle_ = 1;
  uint64_t moved_ = 0;
  std::unordered_map<uintptr_t, uint64_t> mapped_;   // address -> handle mapped there
  std::unordered_map<uint64_t, uintptr_t> parked_;   // handle -> address where its (inaccessible) pages sit
};

class SimulatedProvider final : public Provider {
 public:
  explicit SimulatedProvider(size_t granule = kHostGranule, Device device = kCPU, bool virtual_memory = true);
  const char* name() const override { return "simulated"; }
  Device device() const override { return device_; }
  size_t granularity() const override { return granule_; }

  void* allocate(size_t bytes) override;
  void deallocate(void*, size_t) noexcept override {}

  bool supports_virtual() const override { return virtual_; }
  void* reserve(size_t bytes) override;
  void unreserve(void*, size_t) noexcept override {}
  std::optional<uint64_t> create_physical() override { return next_handle_++; }
  void release_physical(uint64_t) noexcept override {}
  void map(void*, uint64_t) override {}
  void unmap(void*) noexcept override {}

 private:
  size_t granule_;
  Device device_;
  uint64_t next_address_;
  uint64_t next_handle_ = 1;
  bool virtual_;
};

}  // namespace ampforge::memory
