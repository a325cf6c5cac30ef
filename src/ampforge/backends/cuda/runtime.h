// Internal to backends/cuda: error checking, device guard, per-device state (streams, allocator, error
// flags, properties). Included by the backend's .cpp and .cu files only (it pulls in the CUDA runtime API).
//
// Errors:
//   AF_CUDA_CHECK(call)        throws ampforge::Error naming the call, file:line and the runtime's error
//                              name and text. cudaErrorMemoryAllocation -> ErrorKind::OutOfMemory;
//                              missing driver/device/kernel image -> NotImplemented; the rest -> Internal.
//   AF_CUDA_CHECK_LAUNCH()     the same for the last kernel launch (cudaGetLastError).
//   AF_CUDA_WARN(call)         never throws (destructors, cleanup): logs a warning, and stays quiet when
//                              the driver is already shutting down (process exit).
//   AF_CUBLAS_CHECK(call)      cuBLAS/cuBLASLt status, with the library's status name and text.
//   AF_CUDNN_CHECK(call)       cuDNN status, with cudnnGetErrorString and cuDNN's last error message.
//                              NOT_SUPPORTED* -> NotImplemented; allocation failures -> OutOfMemory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ampforge/core/allocator.h"
#include "ampforge/core/device.h"

namespace ampforge::memory {
class CachingAllocator;
}

namespace ampforge::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
void warn_cuda_error(cudaError_t err, const char* call, const char* file, int line) noexcept;
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
// `status` is a cudnnStatus_t (an int here, so that this header does not need cudnn.h).
[[noreturn]] void throw_cudnn_error(int status, const char* call, const char* file, int line);

#define AF_CUDA_CHECK(call)                                                                      \
  do {                                                                                           \
    const cudaError_t af_cuda_err_ = (call);                                                     \
    if (af_cuda_err_ != cudaSuccess) [[unlikely]]                                                \
      ::ampforge::cuda::throw_cuda_error(af_cuda_err_, #call, __FILE__, __LINE__);               \
  } while (0)

#define AF_CUDA_CHECK_LAUNCH() AF_CUDA_CHECK(cudaGetLastError())

#define AF_CUDA_WARN(call)                                                                       \
  do {                                                                                           \
    const cudaError_t af_cuda_err_ = (call);                                                     \
    if (af_cuda_err_ != cudaSuccess) ::ampforge::cuda::warn_cuda_error(af_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define AF_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                           \
    const int af_cublas_st_ = static_cast<int>(call);                                            \
    if (af_cublas_st_ != 0) [[unlikely]]                                                         \
      ::ampforge::cuda::throw_cublas_error(af_cublas_st_, #call, __FILE__, __LINE__);            \
  } while (0)

#define AF_CUDNN_CHECK(call)                                                                     \
  do {                                                                                           \
    const int af_cudnn_st_ = static_cast<int>(call);                                             \
    if (af_cudnn_st_ != 0) [[unlikely]]                                                          \
      ::ampforge::cuda::throw_cudnn_error(af_cudnn_st_, #call, __FILE__, __LINE__);              \
  } while (0)

// Makes `device` current on this thread for the guard's lifetime (restores the previous device after).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  explicit DeviceGuard(Device device) : DeviceGuard(static_cast<int>(device.index)) {}
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

// Codes kernels write into the device's error word (bit flags); see check_device_errors().
enum DeviceErrorCode : int {
  kErrTargetOutOfRange = 1,  // cross_entropy: target not in [0, C) and not ignore_index
  kErrIndexOutOfRange = 2,   // embedding / embedding_backward: index not in [0, num_embeddings)
};

// Everything the backend keeps per device. Created on first use, never destroyed (storages and streams
// may be used until the process exits; tearing CUDA objects down during static destruction races the
// driver's own shutdown).
struct DeviceState {
  int index = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  int sm_count = 1;
  int max_threads_per_sm = 2048;
  int cc_major = 0, cc_minor = 0;
  memory::CachingAllocator* allocator = nullptr;
  // One int in pinned, mapped host memory: kernels store error codes into it through `error_word_dev`,
  // the host reads `error_word_host` after a synchronisation. No copy is needed to look at it.
  volatile int* error_word_host = nullptr;
  int* error_word_dev = nullptr;
};

// The state of `device` (initialised on first call; throws InvalidArgument for a device that does not
// exist). Thread-safe.
DeviceState& device_state(int device);
inline DeviceState& device_state(Device d) { return device_state(static_cast<int>(d.index)); }
// The compute stream of the device holding a tensor.
inline cudaStream_t stream_for(Device d) { return device_state(d).compute; }

// The Allocator installed for DeviceType::CUDA (routes to each device's caching allocator).
Allocator* cuda_allocator();

// ---- where this thread's CUDA allocations go ----------------------------------------------------------
// By default: the device's caching allocator, keyed by its compute stream. Two exceptions, both set per
// thread for a scope:
//   - CaptureAllocationGuard: while this thread captures a CUDA graph (graph.cpp), allocations on that
//     device come from the graph's private pool, a separate CachingAllocator: the addresses a replay
//     reuses can never be handed to other work, and nothing the capture frees goes back to eager code.
//   - CopyStreamAllocationGuard: allocations on that device are keyed by its copy stream (host-to-device
//     uploads of the DataLoader, upload.cpp); the consumer marks their use on the compute stream with
//     record_stream, so a block is reused only after both streams are done with it.
// Frees find the right allocator by address (every pool registered with register_pool stays known).
class CaptureAllocationGuard {
 public:
  CaptureAllocationGuard(int device, memory::CachingAllocator* pool);
  ~CaptureAllocationGuard();
  CaptureAllocationGuard(const CaptureAllocationGuard&) = delete;
  CaptureAllocationGuard& operator=(const CaptureAllocationGuard&) = delete;

 private:
  int prev_device_;
  memory::CachingAllocator* prev_pool_;
};

class CopyStreamAllocationGuard {
 public:
  explicit CopyStreamAllocationGuard(int device);
  ~CopyStreamAllocationGuard();
  CopyStreamAllocationGuard(const CopyStreamAllocationGuard&) = delete;
  CopyStreamAllocationGuard& operator=(const CopyStreamAllocationGuard&) = delete;

 private:
  int prev_device_;
};

// Makes frees of `pool`'s blocks on `device` reach it. Pools are never unregistered: a tensor may outlive
// the graph that allocated it (the trainer keeps the captured loss). The pool object must stay alive.
void register_pool(int device, memory::CachingAllocator* pool);

// Counts one host wait on device work (stream/event synchronisation, a copy to the CPU). See
// cuda::host_sync_count().
void count_host_sync() noexcept;

// Raw device memory from the device's caching allocator, on its compute stream (scratch space for
// kernels: reduction partials, cuBLASLt workspace). Freed with free_scratch; the allocator keeps the
// block for reuse by later work on the same stream, which runs after the work that used it.
void* alloc_scratch(int device, size_t bytes);
void free_scratch(int device, void* ptr) noexcept;

// A scratch allocation that gives its memory back at scope exit.
class Scratch {
 public:
  Scratch(int device, size_t bytes) : device_(device), ptr_(bytes ? alloc_scratch(device, bytes) : nullptr) {}
  ~Scratch() {
    if (ptr_ != nullptr) free_scratch(device_, ptr_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  int device_;
  void* ptr_;
};

}  // namespace ampforge::cuda
