#include "ampforge/amp/autocast.h"

#include "ampforge/util/error.h"

namespace ampforge::amp {

Autocast::Autocast(Device device, DType dtype, bool enabled)
    : device_(device.type), prev_(autograd::autocast_state(device.type)) {
  AF_CHECK(dtype_is_16bit_float(dtype), "Autocast: dtype must be f16 or bf16, got {}", dtype_name(dtype));
  autograd::set_autocast_state(device_, {enabled, dtype});
  autograd::autocast_enter();
}

Autocast::~Autocast() {
  autograd::set_autocast_state(device_, prev_);
  autograd::autocast_exit();
}

bool is_autocast_enabled(DeviceType device) { return autograd::autocast_state(device).enabled; }

DType autocast_dtype(DeviceType device) { return autograd::autocast_state(device).dtype; }

}  // namespace ampforge::amp
