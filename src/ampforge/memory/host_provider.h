// Host providers.
//   HostProvider       real memory. Plain segments from aligned_alloc; virtual memory on Linux with
//                      mmap(PROT_NONE) to reserve, mprotect(READ|WRITE) to map a granule and
//                      madvise(MADV_DONTNEED) + mprotect(PROT_NONE) to unmap it (the pages go back to the
//                      kernel). A host "physical granule" is the right to have one granule mapped: the data
//                      does not follow a handle to a new address (CUDA's does), which the policy never needs,
//                      since it only moves granules that hold no live block.
//   SimulatedProvider  address space only: unique, aligned addresses that must never be dereferenced. For
//                      replaying traces, for simulations of a large card on a small machine (wrap it in
//                      a BudgetedProvider to give it a capacity) and for the meta device. Without virtual
//                      memory (virtual_memory = false) it offers plain segments only, as cudaMalloc does.
#pragma once

#include <cstdint>

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

 private:
  size_t granule_;
  uint64_t next_handle_ = 1;
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
