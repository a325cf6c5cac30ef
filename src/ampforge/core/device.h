// Where a tensor lives. CPU always exists; CUDA devices exist when the CUDA backend was built and a
// GPU is present. Asking for a device that is not available raises a clear error at the point of use.
// Meta always exists: its tensors have shapes, dtypes, strides and storage sizes but no data; its kernels
// compute nothing, and its storages come from a caching allocator that hands out addresses without memory
// (backends/meta/meta.h), so a training step can be run to measure memory for a device not at hand.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ampforge {

#define AF_FOR_EACH_DEVICE_TYPE(X) \
  X(CPU, "cpu")                    \
  X(CUDA, "cuda")                  \
  X(Meta, "meta")

enum class DeviceType : uint8_t {
#define AF_DEVICE_ENUM(name, str) name,
  AF_FOR_EACH_DEVICE_TYPE(AF_DEVICE_ENUM)
#undef AF_DEVICE_ENUM
};
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::CPU;
  int16_t index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int idx = 0) : type(t), index(static_cast<int16_t>(idx)) {}
  // Parses "cpu", "cuda", "cuda:1", "meta".
  static Device parse(std::string_view s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline constexpr Device kMeta{DeviceType::Meta, 0};

const char* device_type_name(DeviceType t);

}  // namespace ampforge
