// CUDA runtime plumbing: error reporting, device discovery, the device guard, per-device state (streams,
// caching allocator, error word) and the Allocator installed for DeviceType::CUDA.
#include "ampforge/backends/cuda/runtime.h"

#include <cublasLt.h>
#if defined(AMPFORGE_WITH_CUDNN)
#include <cudnn.h>
#endif

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ampforge/backends/cuda/cuda.h"
#include "ampforge/core/allocator.h"
#include "ampforge/memory/caching_allocator.h"
#include "ampforge/memory/cuda_provider.h"
#include "ampforge/util/env.h"
#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

namespace ampforge::cuda {

// ---- errors ---------------------------------------------------------------------------------------

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  ErrorKind kind = ErrorKind::Internal;
  const char* hint = "";
  switch (err) {
    case cudaErrorMemoryAllocation:
      kind = ErrorKind::OutOfMemory;
      hint = " (the caching allocator could not help: memory is held outside it, or by another process)";
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      kind = ErrorKind::NotImplemented;
      if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorUnsupportedPtxVersion)
        hint = " (this build's CMAKE_CUDA_ARCHITECTURES do not cover this GPU; rebuild with "
               "-DCMAKE_CUDA_ARCHITECTURES=native)";
      break;
    default: break;
  }
  // Clears the runtime's last-error slot so that the next unrelated check does not report this again
  // (sticky errors such as an illegal address stay: the context is unusable after them).
  (void)cudaGetLastError();
  detail::throw_error(kind, file, line, nullptr,
                      fmt::format("CUDA error: {} failed at {}:{}: {} ({}){}", call, file, line, cudaGetErrorName(err),
                                  cudaGetErrorString(err), hint));
}

void warn_cuda_error(cudaError_t err, const char* call, const char* file, int line) noexcept {
  (void)cudaGetLastError();
  // At process exit the runtime may already be unloading: nothing is wrong, and nothing can be done.
  if (err == cudaErrorCudartUnloading || err == cudaErrorContextIsDestroyed) return;
  try {
    log(LogLevel::Warn, "CUDA error (ignored): {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorName(err),
        cudaGetErrorString(err));
  } catch (...) {
  }
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  const auto st = static_cast<cublasStatus_t>(status);
  const ErrorKind kind = st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::OutOfMemory
                         : st == CUBLAS_STATUS_NOT_SUPPORTED ? ErrorKind::NotImplemented
                                                             : ErrorKind::Internal;
  detail::throw_error(kind, file, line, nullptr,
                      fmt::format("cuBLAS error: {} failed at {}:{}: {} ({})", call, file, line,
                                  cublasLtGetStatusName(st), cublasLtGetStatusString(st)));
}

void throw_cudnn_error(int status, const char* call, const char* file, int line) {
  ErrorKind kind = ErrorKind::Internal;
  std::string name = fmt::format("status {}", status), said;
#if defined(AMPFORGE_WITH_CUDNN)
  const auto st = static_cast<cudnnStatus_t>(status);
  if (CUDNN_STATUS_CATEGORY(status) == CUDNN_STATUS_NOT_SUPPORTED)
    kind = ErrorKind::NotImplemented;
  else if (st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
           st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    kind = ErrorKind::OutOfMemory;
  name = fmt::format("{} ({})", cudnnGetErrorString(st), status);
#if CUDNN_MAJOR >= 9
  // The library's own explanation of its most recent failure on this thread (which parameter, which limit).
  char message[512] = {};
  cudnnGetLastErrorString(message, sizeof(message));
  message[sizeof(message) - 1] = '\0';
  if (message[0] != '\0') said = std::string("; cuDNN says: ") + message;
#endif
#endif
  detail::throw_error(kind, file, line, nullptr,
                      fmt::format("cuDNN error: {} failed at {}:{}: {}{}", call, file, line, name, said));
}

// ---- discovery --------------------------------------------------------------------------------------

namespace {

struct Discovery {
  int count = 0;
  std::string reason;
};

const Discovery& discovery() {
  static Discovery d;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    if (err != cudaSuccess) {
      d.reason = fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
      // Without any driver the runtime says "insufficient driver"; name the real cause when we can.
      if (const memory::CudaDriverStatus drv = memory::cuda_driver_status(); !drv.available)
        d.reason += "; driver: " + drv.reason;
      return;
    }
    if (n <= 0) {
      d.reason = "the CUDA runtime sees no GPU";
      return;
    }
    // The caching allocator's provider talks to the driver API directly; it must agree.
    const memory::CudaDriverStatus drv = memory::cuda_driver_status();
    if (!drv.available) {
      d.reason = "the CUDA runtime sees a GPU but the driver API does not: " + drv.reason;
      return;
    }
    d.count = n < drv.device_count ? n : drv.device_count;
  });
  return d;
}

// Read from the environment on first use (not during static initialisation, where a bad value could
// only terminate the process).
std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{env_flag("AMPFORGE_ALLOW_TF32", false)};
  return flag;
}

// ---- per-device state -------------------------------------------------------------------------------

struct Slot {
  std::once_flag once;
  DeviceState state;
  // Owned here, never destroyed (see DeviceState).
  memory::Provider* provider = nullptr;
  memory::CudaStreamEvents* events = nullptr;
};

std::vector<Slot>& slots() {
  static auto* v = new std::vector<Slot>(static_cast<size_t>(discovery().count));
  return *v;
}

void init_slot(Slot& slot, int device) {
  DeviceGuard guard(device);
  DeviceState& s = slot.state;
  s.index = device;
  AF_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_count, cudaDevAttrMultiProcessorCount, device));
  AF_CUDA_CHECK(cudaDeviceGetAttribute(&s.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  AF_CUDA_CHECK(cudaDeviceGetAttribute(&s.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  AF_CUDA_CHECK(cudaDeviceGetAttribute(&s.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  // Non-blocking: our streams do not serialise with the legacy default stream that other libraries in
  // the process may use.
  AF_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
  AF_CUDA_CHECK(cudaStreamCreateWithFlags(&s.copy, cudaStreamNonBlocking));
  void* word = nullptr;
  AF_CUDA_CHECK(cudaHostAlloc(&word, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  *static_cast<volatile int*>(word) = 0;
  s.error_word_host = static_cast<volatile int*>(word);
  // With unified addressing (every 64-bit process) pinned host memory is reachable from kernels at its
  // host address, whatever the device flags; cudaHostGetDevicePointer would need cudaDeviceMapHost.
  int unified = 0;
  AF_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device));
  void* dword = word;
  if (!unified) AF_CUDA_CHECK(cudaHostGetDevicePointer(&dword, word, 0));
  s.error_word_dev = static_cast<int*>(dword);
  // Memory: the cudaMalloc provider by default; AMPFORGE_CUDA_EXPANDABLE_SEGMENTS=1 selects the
  // virtual-memory provider (expandable segments, docs/MEMORY.md).
  if (env_flag("AMPFORGE_CUDA_EXPANDABLE_SEGMENTS", false))
    slot.provider = new memory::CudaVmmProvider(device);
  else
    slot.provider = new memory::CudaProvider(device);
  slot.events = new memory::CudaStreamEvents(device);
  s.allocator = new memory::CachingAllocator(*slot.provider, memory::PolicyConfig::ampforge(), slot.events);
}

// ---- allocation routing ------------------------------------------------------------------------------

thread_local int t_capture_device = -1;
thread_local memory::CachingAllocator* t_capture_pool = nullptr;
thread_local int t_copy_device = -1;

// Graph pools per device (registered once, never removed; see register_pool).
struct PoolRegistry {
  std::mutex mu;
  std::vector<std::pair<int, memory::CachingAllocator*>> pools;
  std::atomic<bool> any{false};
};
PoolRegistry& pool_registry() {
  static auto* r = new PoolRegistry;
  return *r;
}

// The allocation for `device` on this thread: the capture pool, or the main allocator on the compute or
// (inside CopyStreamAllocationGuard) the copy stream.
void* route_allocation(int device, size_t nbytes) {
  DeviceState& s = device_state(device);
  if (t_capture_pool != nullptr && t_capture_device == device)
    return t_capture_pool->allocate_on(nbytes, reinterpret_cast<memory::StreamId>(s.compute));
  const cudaStream_t stream = t_copy_device == device ? s.copy : s.compute;
  return s.allocator->allocate_on(nbytes, reinterpret_cast<memory::StreamId>(stream));
}

void route_free(int device, void* ptr) noexcept {
  auto& v = slots();
  if (device < 0 || static_cast<size_t>(device) >= v.size()) return;
  PoolRegistry& reg = pool_registry();
  if (reg.any.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto& [d, pool] : reg.pools)
      if (d == device && pool->owns(ptr)) {
        pool->free(ptr);
        return;
      }
  }
  DeviceState& s = v[static_cast<size_t>(device)].state;
  if (s.allocator != nullptr) s.allocator->free(ptr);
}

// The Allocator for DeviceType::CUDA: routes each request to the device's caching allocator, on the
// device's compute stream (the stream every kernel of the backend runs on, so a freed block can be
// reused at once by later work: stream order keeps it safe), with the per-thread exceptions above.
class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override { return route_allocation(device.index, nbytes); }
  void deallocate(void* ptr, size_t, Device device) noexcept override { route_free(device.index, ptr); }
  const char* name() const override { return "cuda-caching"; }
};

}  // namespace

CaptureAllocationGuard::CaptureAllocationGuard(int device, memory::CachingAllocator* pool)
    : prev_device_(t_capture_device), prev_pool_(t_capture_pool) {
  t_capture_device = device;
  t_capture_pool = pool;
}
CaptureAllocationGuard::~CaptureAllocationGuard() {
  t_capture_device = prev_device_;
  t_capture_pool = prev_pool_;
}

CopyStreamAllocationGuard::CopyStreamAllocationGuard(int device) : prev_device_(t_copy_device) {
  t_copy_device = device;
}
CopyStreamAllocationGuard::~CopyStreamAllocationGuard() { t_copy_device = prev_device_; }

void register_pool(int device, memory::CachingAllocator* pool) {
  PoolRegistry& reg = pool_registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.pools.emplace_back(device, pool);
  reg.any.store(true, std::memory_order_release);
}

// One process-wide counter, shared with the caching allocator's event and stream waits (memory/provider.h).
void count_host_sync() noexcept { memory::note_host_wait(); }
uint64_t host_sync_count() { return memory::host_wait_count(); }

DeviceState& device_state(int device) {
  auto& v = slots();
  AF_CHECK(device >= 0 && static_cast<size_t>(device) < v.size(), "CUDA device {} does not exist ({} device{} {})",
           device, v.size(), v.size() == 1 ? "" : "s", v.empty() ? discovery().reason : "available");
  Slot& slot = v[static_cast<size_t>(device)];
  std::call_once(slot.once, [&] { init_slot(slot, device); });
  return slot.state;
}

Allocator* cuda_allocator() {
  static CudaAllocator a;
  return &a;
}

void* alloc_scratch(int device, size_t bytes) { return route_allocation(device, bytes); }

void free_scratch(int device, void* ptr) noexcept { route_free(device, ptr); }

// ---- device guard -----------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) : device_(device) {
  AF_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) AF_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) AF_CUDA_WARN(cudaSetDevice(previous_));
}

// ---- public interface (cuda.h) ---------------------------------------------------------------------

bool is_built() { return true; }
int device_count() { return discovery().count; }
std::string unavailable_reason() { return discovery().reason; }

void check_device_errors(int device) {
  DeviceState& s = device_state(device);
  const int word = *s.error_word_host;
  if (word == 0) return;
  *s.error_word_host = 0;
  std::string what;
  if (word & kErrTargetOutOfRange)
    what = "cross_entropy: a target class index was outside [0, C) and not equal to ignore_index (the loss of "
           "that row is NaN)";
  if (word & kErrIndexOutOfRange)
    what += std::string(what.empty() ? "" : "; ") +
            "embedding: an index was outside [0, num_embeddings) (its output row is zero and it contributed no "
            "gradient)";
  if (what.empty()) what = fmt::format("unknown device error code {}", word);
  AF_THROW(InvalidArgument, "CUDA device {}: a kernel reported invalid input since the last synchronisation: {}",
           device, what);
}

void synchronize(int device) {
  const int n = device_count();
  for (int d = device < 0 ? 0 : device; d < (device < 0 ? n : device + 1); ++d) {
    DeviceState& s = device_state(d);
    DeviceGuard guard(d);
    count_host_sync();
    AF_CUDA_CHECK(cudaStreamSynchronize(s.compute));
    AF_CUDA_CHECK(cudaStreamSynchronize(s.copy));
    check_device_errors(d);
  }
}

void set_allow_tf32(bool allow) { tf32_flag().store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }

uint64_t compute_stream(int device) { return reinterpret_cast<uint64_t>(device_state(device).compute); }
uint64_t copy_stream(int device) { return reinterpret_cast<uint64_t>(device_state(device).copy); }

memory::CachingAllocator* caching_allocator(int device) {
  if (device < 0 || device >= device_count()) return nullptr;
  return device_state(device).allocator;
}

}  // namespace ampforge::cuda
