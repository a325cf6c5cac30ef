// The CPU batch-norm kernels' two equivalent paths for F32 channels-last data (norm.cpp), for tests that compare them.
//
// batch_norm and batch_norm_backward run F32 rows-layout problems (channels-last, or (N, C)) with activation None or
// ReLU through fused passes that compute in registers and prefetch; every other dtype, layout and activation runs the
// general path (loaders, block buffers, channel_sums / channel_apply). Both give the same bits by construction (same
// partition of the statistics, same order of additions, same arithmetic per element). Turning the fused passes off
// makes the general path run everything, which is what BatchNorm.F32ChannelsLast*KeepsTheGeneralPathsBits compares
// against; nothing else should turn them off (the general path is the slower one). Process-wide, not per thread.
#pragma once

namespace ampforge::cpu {

void set_batch_norm_fused_f32(bool on);
bool batch_norm_fused_f32();

}  // namespace ampforge::cpu
