#include "ampforge/core/allocator.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

#include "ampforge/util/error.h"

namespace ampforge {
namespace {

std::atomic<int64_t> g_host_bytes{0};
std::atomic<int64_t> g_host_peak{0};

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    AF_ASSERT(device.is_cpu(), "host allocator asked for {} memory", device.str());
    const size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr)
      AF_THROW(OutOfMemory, "out of host memory: could not allocate {} bytes ({:.2f} MiB already allocated by ampforge)",
               nbytes, static_cast<double>(g_host_bytes.load()) / (1 << 20));
    const int64_t now = g_host_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) +
                        static_cast<int64_t>(nbytes);
    int64_t peak = g_host_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_host_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, Device) noexcept override {
    g_host_bytes.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    std::free(ptr);
  }
  const char* name() const override { return "host"; }
};

std::array<std::atomic<Allocator*>, kNumDeviceTypes>& table() {
  static std::array<std::atomic<Allocator*>, kNumDeviceTypes> t{};
  static bool init = [] {
    t[static_cast<int>(DeviceType::CPU)].store(host_allocator());
    return true;
  }();
  (void)init;
  return t;
}

}  // namespace

Allocator* host_allocator() {
  static HostAllocator a;
  return &a;
}

int64_t host_allocator_bytes_in_use() { return g_host_bytes.load(std::memory_order_relaxed); }
int64_t host_allocator_peak_bytes() { return g_host_peak.load(std::memory_order_relaxed); }

Allocator* get_allocator(DeviceType type) { return table()[static_cast<int>(type)].load(std::memory_order_acquire); }

Allocator* set_allocator(DeviceType type, Allocator* a) {
  return table()[static_cast<int>(type)].exchange(a, std::memory_order_acq_rel);
}

}  // namespace ampforge
