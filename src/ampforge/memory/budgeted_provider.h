// BudgetedProvider: another provider with a physical capacity of N bytes, e.g. a 16 GiB card reproduced
// on the host (`BudgetedProvider(host, 16 << 30)`), or a simulated one for trace replay.
//
// What counts against the budget: plain segments by their size rounded up to 512 bytes, and each
// physical granule created (granularity() bytes) until it is released. Address ranges (reserve) are free,
// as on a GPU. Over budget, allocate() returns nullptr and create_physical() std::nullopt, exactly as the
// inner provider would when its own memory runs out.
#pragma once

#include <cstdint>

#include "ampforge/memory/provider.h"

namespace ampforge::memory {

class BudgetedProvider final : public Provider {
 public:
  BudgetedProvider(Provider& inner, size_t capacity_bytes);
  const char* name() const override { return "budgeted"; }
  Device device() const override { return inner_.device(); }
  size_t granularity() const override { return inner_.granularity(); }
  size_t capacity() const override { return capacity_; }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;

  bool supports_virtual() const override { return inner_.supports_virtual(); }
  void* reserve(size_t bytes) override { return inner_.reserve(bytes); }
  void unreserve(void* base, size_t bytes) noexcept override { inner_.unreserve(base, bytes); }
  std::optional<uint64_t> create_physical() override;
  void release_physical(uint64_t handle) noexcept override;
  void map(void* addr, uint64_t handle) override { inner_.map(addr, handle); }
  void unmap(void* addr) noexcept override { inner_.unmap(addr); }

  // Bytes counted against the budget now, and the most ever.
  size_t used() const { return used_; }
  size_t peak_used() const { return peak_; }

 private:
  static size_t charge(size_t bytes) { return (bytes + 511) / 512 * 512; }
  Provider& inner_;
  size_t capacity_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

}  // namespace ampforge::memory
