#include "ampforge/memory/budgeted_provider.h"

#include <algorithm>

namespace ampforge::memory {

BudgetedProvider::BudgetedProvider(Provider& inner, size_t capacity_bytes)
    : inner_(inner), capacity_(capacity_bytes) {}

void* BudgetedProvider::allocate(size_t bytes) {
  const size_t c = charge(bytes);
  if (c > capacity_ - std::min(capacity_, used_)) return nullptr;
  void* p = inner_.allocate(bytes);
  if (p == nullptr) return nullptr;
  used_ += c;
  peak_ = std::max(peak_, used_);
  return p;
}

void BudgetedProvider::deallocate(void* ptr, size_t bytes) noexcept {
  inner_.deallocate(ptr, bytes);
  used_ -= charge(bytes);
}

std::optional<uint64_t> BudgetedProvider::create_physical() {
  const size_t g = granularity();
  if (g > capacity_ - std::min(capacity_, used_)) return std::nullopt;
  auto h = inner_.create_physical();
  if (!h) return std::nullopt;
  used_ += g;
  peak_ = std::max(peak_, used_);
  return h;
}

void BudgetedProvider::release_physical(uint64_t handle) noexcept {
  inner_.release_physical(handle);
  used_ -= granularity();
}

}  // namespace ampforge::memory
