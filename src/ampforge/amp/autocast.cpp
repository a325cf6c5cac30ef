#include "ampforge/amp/autocast.h"

#include "ampforge/util/error.h"

namespace ampforge::amp {

Autocast::Autocast(Device device, DType dtype, bool enabled) : prev_(autograd::autocast_state()) {
  AF_CHECK(dtype_is_16bit_float(dtype), "Autocast: dtype must be f16 or bf16, got {}", dtype_name(dtype));
  autograd::set_autocast_state({enabled, dtype, device.type});
  autograd::autocast_enter();
}

Autocast::~Autocast() {
  autograd::set_autocast_state(prev_);
  autograd::autocast_exit();
}

bool is_autocast_enabled(DeviceType device) {
  auto s = autograd::autocast_state();
  return s.enabled && s.device == device;
}

DType autocast_dtype() { return autograd::autocast_state().dtype; }

}  // namespace ampforge::amp
