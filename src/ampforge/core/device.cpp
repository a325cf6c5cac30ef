#include "ampforge/core/device.h"

#include <charconv>

#include "ampforge/util/error.h"

namespace ampforge {

const char* device_type_name(DeviceType t) {
  switch (t) {
#define AF_DEVICE_NAME(name, str) \
  case DeviceType::name: return str;
    AF_FOR_EACH_DEVICE_TYPE(AF_DEVICE_NAME)
#undef AF_DEVICE_NAME
  }
  return "?";
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return Device(DeviceType::CPU, 0);
  if (s == "meta") return Device(DeviceType::Meta, 0);
  if (s.substr(0, 4) == "cuda") {
    if (s.size() == 4) return Device(DeviceType::CUDA, 0);
    if (s[4] == ':') {
      int idx = -1;
      auto rest = s.substr(5);
      auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), idx);
      if (ec == std::errc() && p == rest.data() + rest.size() && idx >= 0 && idx < 1024)
        return Device(DeviceType::CUDA, idx);
    }
  }
  AF_THROW(InvalidArgument, "unknown device '{}': expected 'cpu', 'cuda', 'cuda:N' or 'meta'", s);
}

std::string Device::str() const {
  if (type == DeviceType::CPU || type == DeviceType::Meta) return device_type_name(type);
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

}  // namespace ampforge
