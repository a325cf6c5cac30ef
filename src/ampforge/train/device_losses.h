// Losses of device (CUDA) steps, kept on the device and read in blocks: one host synchronisation per
// block instead of one per step. Works on any device (on the CPU a read costs nothing extra).
#pragma once

#include <cstdint>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::train {

class DeviceLosses {
 public:
  DeviceLosses(Device dev, int64_t capacity);
  // Queues a copy of `loss` (one element) into the block (no synchronisation); true when the block is
  // full and must be read before the next add.
  bool add(const Tensor& loss);
  // The queued losses in step order (one synchronisation); empties the block.
  std::vector<double> read();
  int64_t pending() const { return n_; }

 private:
  Tensor buf_;  // (capacity) F32 on the device
  int64_t cap_, n_ = 0;
};

}  // namespace ampforge::train
