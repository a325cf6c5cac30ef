// The CPU batch-norm kernels' two equivalent paths for channels-last data (norm.cpp), for tests that compare them.
//
// batch_norm and batch_norm_backward run rows-layout problems (channels-last, or (N, C)) in F32 or BF16 with
// activation None or ReLU through fused passes that compute in registers and prefetch; every other dtype, layout and
// activation runs the general path (loaders, block buffers, channel_sums / channel_apply). Both give the same bits
// by construction (same partition of the statistics, same order of additions, same arithmetic per element, same
// rounding to BF16), as long as the compiler contracts the shared expressions into FMAs alike in both (GCC 12 does
// for F32 and BF16; not for F16, which therefore stays on the general path: norm.cpp, kFusedStorage).
// Turning the fused passes off makes the general path run everything, which is what
// BatchNorm.ChannelsLastFusedPassesKeepTheGeneralPathsBits compares against; nothing else should turn them off (the
// general path is the slower one). Process-wide, not per thread.
#pragma once

namespace ampforge::cpu {

void set_batch_norm_fused(bool on);
bool batch_norm_fused();

}  // namespace ampforge::cpu
