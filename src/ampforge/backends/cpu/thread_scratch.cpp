// See thread_scratch.h.
#include "ampforge/backends/cpu/thread_scratch.h"

#include <atomic>
#include <memory>
#include <new>

namespace ampforge::cpu {

namespace {
struct FreeAligned {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using Buffer = std::unique_ptr<void, FreeAligned>;
std::atomic<int64_t> g_bytes{0}, g_grows{0};

struct Slots {
  Buffer buf[kScratchSlots];
  size_t cap[kScratchSlots] = {};
  ~Slots() {
    for (size_t c : cap) g_bytes.fetch_sub(static_cast<int64_t>(c), std::memory_order_relaxed);
  }
};
}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  if (bytes == 0) return nullptr;
  thread_local Slots slots;
  if (slots.cap[slot] < bytes) {
    slots.buf[slot].reset();  // free first: the old and the new one need not both be resident
    slots.buf[slot] = Buffer(::operator new[](bytes, std::align_val_t{64}));
    g_bytes.fetch_add(static_cast<int64_t>(bytes - slots.cap[slot]), std::memory_order_relaxed);
    g_grows.fetch_add(1, std::memory_order_relaxed);
    slots.cap[slot] = bytes;
  }
  return slots.buf[slot].get();
}

int64_t thread_scratch_bytes() { return g_bytes.load(std::memory_order_relaxed); }
int64_t thread_scratch_grows() { return g_grows.load(std::memory_order_relaxed); }

}  // namespace ampforge::cpu
