// CUDA providers, over the driver API loaded at run time (dlopen("libcuda.so.1")): the binary never needs
// CUDA at link time, and on a machine without a driver these report "not available" instead of failing.
//   CudaProvider     plain segments: cuMemAlloc / cuMemFree.
//   CudaVmmProvider  virtual memory: cuMemAddressReserve, cuMemCreate (one granule of the device's
//                    minimum granularity), cuMemMap + cuMemSetAccess, cuMemUnmap, cuMemRelease,
//                    cuMemAddressFree; plain segments too (cuMemAlloc).
//   CudaStreamEvents the policy's stream rule with CUDA events (cuEventRecord / cuEventQuery), stream
//                    synchronisation and capture status (cuStreamSynchronize / cuStreamIsCapturing).
// Both providers work in the device's primary context, made current on the calling thread for each call and the
// thread's previous context restored after it (with several GPUs the runtime reads a current primary context as
// the current device).
// Compiled with the toolkit's <cuda.h> for types when it is found at build time; otherwise every
// constructor raises NotImplemented saying so.
#pragma once

#include <string>

#include "ampforge/memory/provider.h"

namespace ampforge::memory {

struct CudaDriverStatus {
  bool available = false;  // libcuda loaded, cuInit succeeded, at least one device
  int device_count = 0;
  std::string reason;      // why not, when not available
};
CudaDriverStatus cuda_driver_status();

class CudaProvider final : public Provider {
 public:
  explicit CudaProvider(int device = 0);  // NotImplemented when the driver or device is not available
  ~CudaProvider() override;
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device(DeviceType::CUDA, device_); }
  size_t granularity() const override { return 512; }
  size_t capacity() const override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;

 private:
  int device_;
  void* ctx_ = nullptr;
};

class CudaVmmProvider final : public Provider {
 public:
  explicit CudaVmmProvider(int device = 0);  // NotImplemented also when the device has no VMM support
  ~CudaVmmProvider() override;
  const char* name() const override { return "cuda-vmm"; }
  Device device() const override { return Device(DeviceType::CUDA, device_); }
  size_t granularity() const override { return granule_; }
  size_t capacity() const override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  bool supports_virtual() const override { return true; }
  void* reserve(size_t bytes) override;
  void unreserve(void* base, size_t bytes) noexcept override;
  std::optional<uint64_t> create_physical() override;
  void release_physical(uint64_t handle) noexcept override;
  void map(void* addr, uint64_t handle) override;
  void unmap(void* addr) noexcept override;

 private:
  int device_;
  void* ctx_ = nullptr;
  size_t granule_ = 0;
};

class CudaStreamEvents final : public StreamEvents {
 public:
  explicit CudaStreamEvents(int device = 0);
  ~CudaStreamEvents() override;
  uint64_t record(StreamId stream) override;  // StreamId: a CUstream cast to an integer (0: legacy default)
  bool query(uint64_t token) override;
  void synchronize(uint64_t token) override;
  void release(uint64_t token) noexcept override;
  void synchronize_stream(StreamId stream) override;  // cuStreamSynchronize
  bool is_capturing(StreamId stream) noexcept override;  // cuStreamIsCapturing
  // synchronize() and synchronize_stream() count as host waits (memory::note_host_wait).

 private:
  int device_;
  void* ctx_ = nullptr;
};

// Small helpers for tests and tools (primary context of `device`): stream creation and copies.
StreamId cuda_stream_create(int device = 0);
void cuda_stream_destroy(StreamId stream, int device = 0) noexcept;
void cuda_copy_to_device(void* dst, const void* src, size_t bytes, int device = 0);
void cuda_copy_to_host(void* dst, const void* src, size_t bytes, int device = 0);

}  // namespace ampforge::memory
