// The CUDA backend's public interface. No CUDA header is included here: tests, the CLI and tools use this
// in every build. In a build without CUDA (AMPFORGE_WITH_CUDA undefined) backends/no_cuda.cpp defines
// these with "nothing available" answers, so callers never need #ifdefs.
//
// Execution model (phase 1):
//   - Every CUDA device has one compute stream and one copy stream (non-blocking streams, created on
//     first use). Every kernel and every copy of the backend runs on the compute stream of the device
//     that holds the tensors, so work on one device executes in program order and no event is needed.
//     The copy stream is for overlapping host-to-device transfers (DataLoader prefetch); code that uses
//     it must record the compute stream's use of the memory (caching allocator's record_stream).
//   - Kernels are asynchronous. Host code sees results only through a synchronising call: a copy to the
//     CPU (Tensor::to("cpu"), item(), tolist()) or synchronize(). Errors that a kernel can only detect
//     on the device (a class index out of range in cross_entropy) are reported at the next such call.
//   - CUDA memory comes from one caching allocator per device (memory/caching_allocator.h) over the
//     cudaMalloc provider (memory/cuda_provider.h), keyed by the device's compute stream.
#pragma once

#include <cstdint>
#include <string>

namespace ampforge::memory {
class CachingAllocator;
}

namespace ampforge::cuda {

// True when this build contains the CUDA backend (independent of any GPU being present).
bool is_built();
// Number of CUDA devices this process can use; 0 without the backend, without a driver, or without a GPU.
int device_count();
inline bool is_available() { return device_count() > 0; }
// Why device_count() is 0 (for skip messages and `ampforge info`); empty when devices are available.
std::string unavailable_reason();

// Blocks until every piece of work queued on `device`'s streams has finished, then reports device-side
// errors (see check_device_errors). device < 0: every device.
void synchronize(int device = -1);
// Throws Error(InvalidArgument) when a kernel of `device` flagged an invalid input since the last check
// (currently: a cross_entropy target outside [0, C) that is not ignore_index), and clears the flag.
// Only meaningful after a synchronisation; synchronising calls run it themselves.
void check_device_errors(int device);

// TF32 tensor-core math for F32 matmul/linear. Default off, as PyTorch >= 1.12
// (torch.backends.cuda.matmul.allow_tf32 = False); the environment variable AMPFORGE_ALLOW_TF32=1 turns it
// on at start. F16/BF16 GEMMs always accumulate in F32.
void set_allow_tf32(bool allow);
bool allow_tf32();

// The streams of a device as opaque ids (the cudaStream_t value), for the allocator's record_stream and
// for code that launches its own work. Creates them on first use. Throws when no such device exists.
uint64_t compute_stream(int device);
uint64_t copy_stream(int device);

// The caching allocator that serves CUDA tensors on `device` (statistics, snapshots, empty_cache).
// nullptr when the device does not exist or the backend is not built.
memory::CachingAllocator* caching_allocator(int device);

}  // namespace ampforge::cuda
