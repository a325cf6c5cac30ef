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
