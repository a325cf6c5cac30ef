// amp::Autocast: the RAII guard of automatic mixed precision, as torch.autocast(device, dtype).
// Inside the region, ops on tensors of that device type run in the precision their category asks for
// (PyTorch's lists for the device type: core/op_list.h, op_amp_category): on CUDA matmul/linear/conv/
// attention in `dtype`, softmax/losses/norms/exp/log/pow/sum in F32; on the CPU the same lower-precision
// ops and only the losses in F32. Other ops, binary ones included, follow type promotion.
// Regions nest; Autocast(dev, dtype, false) disables autocast for dev's type inside an enabled region.
// State is per device type: a CPU region does not change CUDA autocast, and the reverse. Parameters cast
// to 16 bits are cached for the outermost region and dropped when it exits.
#pragma once

#include "ampforge/autograd/autocast.h"
#include "ampforge/core/device.h"
#include "ampforge/core/dtype.h"

namespace ampforge::amp {

class Autocast {
 public:
  Autocast(Device device, DType dtype = DType::F16, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType device_;
  autograd::AutocastState prev_;
};

// True when autocast is on in this thread for the device type.
bool is_autocast_enabled(DeviceType device);
// The autocast dtype for the device type in this thread (meaningful when enabled).
DType autocast_dtype(DeviceType device);

}  // namespace ampforge::amp
