// Autocast mechanism (the policy lives in the op list's AmpCategory column and op_amp_category(); the
// RAII guard users hold is amp::Autocast in amp/). Differentiable functions call autocast_inputs() first:
// under autocast for the inputs' device type it casts floating inputs per the op's category for that
// device type, through the differentiable cast, so gradients flow back to F32 parameters in F32. Leaf
// tensors that require grad (parameters) are cast once per autocast region and reused (the weight-cast
// cache), dropped when the outermost region exits.
//
// The state is kept per device type, as PyTorch keeps it: a CPU region inside a CUDA one (or a disabled
// CPU region) leaves CUDA autocast as it was.
#pragma once

#include <vector>

#include "ampforge/core/op_list.h"
#include "ampforge/core/tensor.h"

namespace ampforge::autograd {

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::F16;
};

// This thread's autocast state for one device type (amp::Autocast saves and restores it).
AutocastState autocast_state(DeviceType device);
void set_autocast_state(DeviceType device, const AutocastState& s);
// Region depth bookkeeping for the weight-cast cache: the cache is cleared when depth returns to 0.
void autocast_enter();
void autocast_exit();
size_t autocast_cache_size();

// Casts `inputs` in place per `op`'s autocast category on their device type. No-op when autocast is off
// for that device type.
void autocast_inputs(OpId op, std::vector<Tensor*> inputs);

}  // namespace ampforge::autograd
