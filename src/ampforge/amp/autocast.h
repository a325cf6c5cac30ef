// amp::Autocast: the RAII guard of automatic mixed precision, as torch.autocast(device, dtype).
// Inside the region, ops run in the precision their category asks for (core/op_list.h's AmpCategory
// column, which follows PyTorch's CUDA autocast lists): matmul/linear/conv/attention in `dtype`,
// softmax/losses/norms/exp/log/pow/sum in F32, binary ops and cat at the widest input type.
// Regions nest; Autocast(dev, dtype, false) disables autocast inside an enabled region. Parameters
// cast to 16 bits are cached for the outermost region and dropped when it exits.
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
  autograd::AutocastState prev_;
};

// True when autocast is on in this thread for the device type.
bool is_autocast_enabled(DeviceType device);
// The autocast dtype in this thread (meaningful when enabled).
DType autocast_dtype();

}  // namespace ampforge::amp
