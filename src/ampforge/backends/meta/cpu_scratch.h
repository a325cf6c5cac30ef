// What the CPU kernels take from the host's caching allocator besides their outputs, modelled for a meta device that
// stands for the CPU (meta.h), so that a meta step's peak stays the CPU step's. Each function receives the KernelArgs
// the CPU kernel would receive and allocates, for the duration of the call and in the same order, what that kernel
// allocates:
//   conv2d*               16-bit convolutions run as F32 problems (backends/cpu/conv.cpp, cpu_conv_in_f32_copies):
//                         F32 copies of the two operands (and of the bias), then the F32 result
//   batch_norm_backward   batch norm + SiLU in training on 16-bit storage keeps dz in an F32 buffer of x's size
//                         (backends/cpu/norm.cpp)
// Every other CPU kernel takes its transient memory outside the allocator (per-thread scratch, thread_scratch.h).
#pragma once

#include "ampforge/core/dispatch.h"

namespace ampforge::meta::cpu_scratch {

void conv2d(const KernelArgs& args);
void conv2d_backward_input(const KernelArgs& args);
void conv2d_backward_weight(const KernelArgs& args);
void batch_norm_backward(const KernelArgs& args);

}  // namespace ampforge::meta::cpu_scratch
