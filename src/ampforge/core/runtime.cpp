#include "ampforge/core/runtime.h"

#include <array>
#include <atomic>

#include "ampforge/core/dispatch.h"
#include "ampforge/util/error.h"

namespace ampforge::runtime {
namespace {

constexpr int kNumCapabilities = 4;

std::array<std::unique_ptr<DeviceRuntime>, kNumDeviceTypes>& runtimes() {
  static std::array<std::unique_ptr<DeviceRuntime>, kNumDeviceTypes> r;
  return r;
}

// Written during registration (under ensure_backends_registered's once), read afterwards.
std::array<std::array<std::atomic<bool>, kNumCapabilities>, kNumDeviceTypes> g_capabilities{};

// The runtime of a type no backend registered: no device, and the reason.
class AbsentRuntime final : public DeviceRuntime {
 public:
  explicit AbsentRuntime(DeviceType t) : type_(t) {}
  bool is_built() const override { return false; }
  int device_count() const override { return 0; }
  std::string unavailable_reason() const override {
    return std::string("this build of ampforge has no ") + device_type_name(type_) + " backend";
  }

 private:
  DeviceType type_;
};

}  // namespace

void declare_capability(DeviceType type, Capability c) {
  g_capabilities[static_cast<int>(type)][static_cast<int>(c)].store(true, std::memory_order_relaxed);
}

DeviceType behaves_as(Device device) {
  if (!device.is_meta()) return device.type;
  return device_runtime(DeviceType::Meta).stands_for();
}

bool has_capability(Device device, Capability c) {
  ensure_backends_registered();  // the backends declare them
  const DeviceType t = behaves_as(device);
  return g_capabilities[static_cast<int>(t)][static_cast<int>(c)].load(std::memory_order_relaxed);
}

std::unique_ptr<EventTimer> DeviceRuntime::event_timer(int) {
  AF_THROW(NotImplemented, "this device has no event timer");
}
std::unique_ptr<Graph> DeviceRuntime::graph(int) { AF_THROW(NotImplemented, "this device cannot capture graphs"); }
std::unique_ptr<Uploader> DeviceRuntime::uploader(int, int) {
  AF_THROW(NotImplemented, "this device takes no asynchronous uploads");
}
std::unique_ptr<PlanningSession> DeviceRuntime::plan_for(DeviceType, uint64_t) {
  AF_THROW(NotImplemented, "only the meta device plans for another device");
}

void register_device_runtime(DeviceType type, std::unique_ptr<DeviceRuntime> runtime) {
  auto& slot = runtimes()[static_cast<int>(type)];
  AF_ASSERT(slot == nullptr, "a device runtime for {} is registered twice", device_type_name(type));
  slot = std::move(runtime);
}

DeviceRuntime& device_runtime(DeviceType type) {
  ensure_backends_registered();
  auto& slot = runtimes()[static_cast<int>(type)];
  if (slot == nullptr) {
    // Only reached for a type whose backend registered nothing; made once, under the same once-guard as the
    // backends (a function-local static per type).
    static std::array<AbsentRuntime, kNumDeviceTypes> absent = {AbsentRuntime(DeviceType::CPU),
                                                                AbsentRuntime(DeviceType::CUDA),
                                                                AbsentRuntime(DeviceType::Meta)};
    return absent[static_cast<int>(type)];
  }
  return *slot;
}

void check_device_exists(Device device, const std::string& what) {
  if (!device.is_cuda()) return;
  const DeviceRuntime& rt = device_runtime(device);
  const int n = rt.device_count();
  AF_CHECK(device.index < n, "{}: no such CUDA device ({} available{}{})", what, n, n == 0 ? ": " : "",
           n == 0 ? rt.unavailable_reason() : "");
}

std::unique_ptr<PlanningSession> plan_for(DeviceType type, uint64_t capacity) {
  return device_runtime(DeviceType::Meta).plan_for(type, capacity);
}

bool plans_expandable_segments(DeviceType type) {
  return device_runtime(DeviceType::Meta).plans_expandable_segments(type);
}

}  // namespace ampforge::runtime
