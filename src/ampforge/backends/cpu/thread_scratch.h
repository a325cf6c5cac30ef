// Transient buffers of CPU kernels, kept per calling thread and reused from call to call: each slot grows to the
// largest request it has seen and is never shrunk. Why: buffers of the sizes these kernels need (up to tens of MB) are
// mmap'ed by glibc when taken from the heap per call, so every call page-faulted them in again and unmapped them after
// (the oneDNN convolutions' scratch: a fifth of a ResNet-50 step, 792 -> 607-634 ms per step, 285,242 -> 55,061 page
// faults per run; the F16 matmul's converted operands: BERT-base's 94 MB vocabulary weight every call;
// docs/PERFORMANCE.md). Outside the caching allocator, which is what the meta device's CPU stand-in models (no kernel
// scratch on the CPU), so `memory fit --device meta` keeps equalling a CPU step.
//
// Users: conv_onednn.cpp and matmul_onednn.cpp (oneDNN scratchpads, reordered weights, blocked activations) and
// blas.cpp's conversion path (the F32 copies of 16-bit operands). A call takes the slots it needs at once, each its own;
// calls on one thread do not nest, so kernels share the slots.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ampforge::cpu {

enum ScratchSlot { kScratch0, kScratch1, kScratch2, kScratch3, kScratchSlots };

// The calling thread's buffer for `slot`, at least `bytes` long and 64-byte aligned, contents undefined; null when
// bytes == 0. Valid until the next call for the same slot on this thread.
void* thread_scratch(ScratchSlot slot, size_t bytes);

int64_t thread_scratch_bytes();  // held by all threads now
int64_t thread_scratch_grows();  // (re)allocations so far

}  // namespace ampforge::cpu
