// CUDA providers over the driver API, loaded with dlopen (see cuda_provider.h).
#include "ampforge/memory/cuda_provider.h"

#include <mutex>

#include "ampforge/util/error.h"
#include "ampforge/util/log.h"

#if __has_include(<cuda.h>)
#include <cuda.h>
#include <dlfcn.h>
#define AF_HAVE_CUDA_HEADERS 1
#else
#define AF_HAVE_CUDA_HEADERS 0
#endif

namespace ampforge::memory {

#if AF_HAVE_CUDA_HEADERS
namespace {

// The driver entry points we use. Types come from <cuda.h>; the symbols from libcuda.so.1 at run time,
// by their ABI names (the _v2 names are what cuda.h's macros point the plain names at).
struct Driver {
#define AF_CU_FN(field, decl) decltype(&::decl) field = nullptr;
#define AF_CU_LIST(X)                                                      \
  X(Init, cuInit)                                                          \
  X(DeviceGetCount, cuDeviceGetCount)                                      \
  X(DeviceGet, cuDeviceGet)                                                \
  X(DeviceGetAttribute, cuDeviceGetAttribute)                              \
  X(PrimaryCtxRetain, cuDevicePrimaryCtxRetain)                            \
  X(PrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)                       \
  X(CtxSetCurrent, cuCtxSetCurrent)                                        \
  X(CtxGetCurrent, cuCtxGetCurrent)                                        \
  X(GetErrorString, cuGetErrorString)                                      \
  X(MemGetInfo, cuMemGetInfo_v2)                                           \
  X(MemAlloc, cuMemAlloc_v2)                                               \
  X(MemFree, cuMemFree_v2)                                                 \
  X(MemGetAllocationGranularity, cuMemGetAllocationGranularity)            \
  X(MemAddressReserve, cuMemAddressReserve)                                \
  X(MemAddressFree, cuMemAddressFree)                                      \
  X(MemCreate, cuMemCreate)                                                \
  X(MemRelease, cuMemRelease)                                              \
  X(MemMap, cuMemMap)                                                      \
  X(MemUnmap, cuMemUnmap)                                                  \
  X(MemSetAccess, cuMemSetAccess)                                          \
  X(MemcpyHtoD, cuMemcpyHtoD_v2)                                           \
  X(MemcpyDtoH, cuMemcpyDtoH_v2)                                           \
  X(EventCreate, cuEventCreate)                                            \
  X(EventRecord, cuEventRecord)                                            \
  X(EventQuery, cuEventQuery)                                              \
  X(EventSynchronize, cuEventSynchronize)                                  \
  X(EventDestroy, cuEventDestroy_v2)                                       \
  X(StreamCreate, cuStreamCreate)                                          \
  X(StreamDestroy, cuStreamDestroy_v2)                                     \
  X(StreamSynchronize, cuStreamSynchronize)                                \
  X(StreamIsCapturing, cuStreamIsCapturing)
  AF_CU_LIST(AF_CU_FN)
#undef AF_CU_FN
  void* lib = nullptr;
  CudaDriverStatus status;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    d.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      d.status.reason = "the NVIDIA driver library libcuda.so.1 could not be loaded (no driver installed?)";
      return;
    }
#define AF_CU_LOAD(field, decl)                                                                 \
  d.field = reinterpret_cast<decltype(d.field)>(dlsym(d.lib, #decl));                          \
  if (d.field == nullptr) {                                                                     \
    d.status.reason = "libcuda.so.1 lacks " #decl " (driver too old for CUDA virtual memory?)"; \
    return;                                                                                     \
  }
    AF_CU_LIST(AF_CU_LOAD)
#undef AF_CU_LOAD
    if (CUresult r = d.Init(0); r != CUDA_SUCCESS) {
      const char* s = nullptr;
      d.GetErrorString(r, &s);
      d.status.reason = fmt::format("cuInit failed: {} (no GPU visible?)", s ? s : "unknown error");
      return;
    }
    int n = 0;
    if (d.DeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
      d.status.reason = "the CUDA driver sees no GPU";
      return;
    }
    d.status.available = true;
    d.status.device_count = n;
  });
  return d;
}

std::string error_text(CUresult r) {
  const char* s = nullptr;
  if (driver().GetErrorString != nullptr) driver().GetErrorString(r, &s);
  return s ? s : fmt::format("CUresult {}", static_cast<int>(r));
}

#define AF_CU(call)                                                                          \
  do {                                                                                       \
    CUresult af_r = (call);                                                                  \
    if (af_r != CUDA_SUCCESS) AF_THROW(Internal, "{} failed: {}", #call, error_text(af_r)); \
  } while (0)

// Loads the driver, checks the device and retains its primary context (not made current: see ContextScope).
void* open_device(int device) {
  const Driver& d = driver();
  if (!d.status.available) AF_THROW(NotImplemented, "CUDA is not available: {}", d.status.reason);
  AF_CHECK(device >= 0 && device < d.status.device_count, "no CUDA device {} (the driver sees {})", device,
           d.status.device_count);
  CUdevice dev;
  AF_CU(d.DeviceGet(&dev, device));
  CUcontext ctx;
  AF_CU(d.PrimaryCtxRetain(&ctx, dev));
  return ctx;
}

void close_device(int device, void* ctx) noexcept {
  if (ctx == nullptr) return;
  CUdevice dev;
  if (driver().DeviceGet(&dev, device) == CUDA_SUCCESS) driver().PrimaryCtxRelease(dev);
}

// Makes a device's primary context current for the driver calls of a scope, then restores the thread's previous
// one. Restoring matters with several GPUs: the CUDA runtime takes a current primary context as the current
// device, so an allocation for device 1 that left device 1's context current would send the thread's next
// runtime calls (kernels meant for device 0) there.
class ContextScope {
 public:
  explicit ContextScope(void* ctx) {
    if (driver().CtxGetCurrent(&previous_) == CUDA_SUCCESS && previous_ == static_cast<CUcontext>(ctx)) return;
    switched_ = driver().CtxSetCurrent(static_cast<CUcontext>(ctx)) == CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (switched_) driver().CtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

size_t device_total(void* ctx) {
  const ContextScope in_context(ctx);
  size_t free_b = 0, total = 0;
  if (driver().MemGetInfo(&free_b, &total) != CUDA_SUCCESS) return 0;
  return total;
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

}  // namespace

CudaDriverStatus cuda_driver_status() { return driver().status; }

// ---- CudaProvider -----------------------------------------------------------------------------------
CudaProvider::CudaProvider(int device) : device_(device), ctx_(open_device(device)) {}
CudaProvider::~CudaProvider() { close_device(device_, ctx_); }
size_t CudaProvider::capacity() const { return device_total(ctx_); }

void* CudaProvider::allocate(size_t bytes) {
  const ContextScope in_context(ctx_);
  CUdeviceptr p = 0;
  const CUresult r = driver().MemAlloc(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) AF_THROW(Internal, "cuMemAlloc({} bytes) failed: {}", bytes, error_text(r));
  return reinterpret_cast<void*>(p);
}

void CudaProvider::deallocate(void* ptr, size_t) noexcept {
  const ContextScope in_context(ctx_);
  note_host_wait();  // cuMemFree waits for the device's queued work (an implicit synchronisation)
  if (CUresult r = driver().MemFree(reinterpret_cast<CUdeviceptr>(ptr)); r != CUDA_SUCCESS)
    log(LogLevel::Warn, "cuMemFree failed: {}", error_text(r));
}

// ---- CudaVmmProvider --------------------------------------------------------------------------------
CudaVmmProvider::CudaVmmProvider(int device) : device_(device), ctx_(open_device(device)) {
  const Driver& d = driver();
  CUdevice dev;
  AF_CU(d.DeviceGet(&dev, device));
  int vmm = 0;
  AF_CU(d.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  if (!vmm) {
    close_device(device_, ctx_);
    AF_THROW(NotImplemented, "CUDA device {} does not support virtual memory management", device);
  }
  const CUmemAllocationProp prop = device_prop(device);
  AF_CU(d.MemGetAllocationGranularity(&granule_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

CudaVmmProvider::~CudaVmmProvider() { close_device(device_, ctx_); }
size_t CudaVmmProvider::capacity() const { return device_total(ctx_); }

void* CudaVmmProvider::allocate(size_t bytes) {
  const ContextScope in_context(ctx_);
  CUdeviceptr p = 0;
  const CUresult r = driver().MemAlloc(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  if (r != CUDA_SUCCESS) AF_THROW(Internal, "cuMemAlloc({} bytes) failed: {}", bytes, error_text(r));
  return reinterpret_cast<void*>(p);
}

void CudaVmmProvider::deallocate(void* ptr, size_t) noexcept {
  const ContextScope in_context(ctx_);
  note_host_wait();  // as CudaProvider::deallocate
  driver().MemFree(reinterpret_cast<CUdeviceptr>(ptr));
}

void* CudaVmmProvider::reserve(size_t bytes) {
  const ContextScope in_context(ctx_);
  CUdeviceptr p = 0;
  if (driver().MemAddressReserve(&p, bytes, granule_, 0, 0) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<void*>(p);
}

void CudaVmmProvider::unreserve(void* base, size_t bytes) noexcept {
  const ContextScope in_context(ctx_);
  driver().MemAddressFree(reinterpret_cast<CUdeviceptr>(base), bytes);
}

std::optional<uint64_t> CudaVmmProvider::create_physical() {
  const ContextScope in_context(ctx_);
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = driver().MemCreate(&h, granule_, &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return std::nullopt;
  if (r != CUDA_SUCCESS) AF_THROW(Internal, "cuMemCreate({} bytes) failed: {}", granule_, error_text(r));
  return static_cast<uint64_t>(h);
}

void CudaVmmProvider::release_physical(uint64_t handle) noexcept {
  const ContextScope in_context(ctx_);
  driver().MemRelease(static_cast<CUmemGenericAllocationHandle>(handle));
}

void CudaVmmProvider::map(void* addr, uint64_t handle) {
  const ContextScope in_context(ctx_);
  const auto va = reinterpret_cast<CUdeviceptr>(addr);
  AF_CU(driver().MemMap(va, granule_, 0, static_cast<CUmemGenericAllocationHandle>(handle), 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  AF_CU(driver().MemSetAccess(va, granule_, &access, 1));
}

void CudaVmmProvider::unmap(void* addr) noexcept {
  const ContextScope in_context(ctx_);
  if (CUresult r = driver().MemUnmap(reinterpret_cast<CUdeviceptr>(addr), granule_); r != CUDA_SUCCESS)
    log(LogLevel::Warn, "cuMemUnmap failed: {}", error_text(r));
}

// ---- events and helpers -----------------------------------------------------------------------------
CudaStreamEvents::CudaStreamEvents(int device) : device_(device), ctx_(open_device(device)) {}
CudaStreamEvents::~CudaStreamEvents() { close_device(device_, ctx_); }

uint64_t CudaStreamEvents::record(StreamId stream) {
  const ContextScope in_context(ctx_);
  CUevent e = nullptr;
  AF_CU(driver().EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  AF_CU(driver().EventRecord(e, reinterpret_cast<CUstream>(stream)));
  return reinterpret_cast<uint64_t>(e);
}

bool CudaStreamEvents::query(uint64_t token) {
  const ContextScope in_context(ctx_);
  const CUresult r = driver().EventQuery(reinterpret_cast<CUevent>(token));
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS) AF_THROW(Internal, "cuEventQuery failed: {}", error_text(r));
  return true;
}

void CudaStreamEvents::synchronize(uint64_t token) {
  const ContextScope in_context(ctx_);
  note_host_wait();
  AF_CU(driver().EventSynchronize(reinterpret_cast<CUevent>(token)));
}

void CudaStreamEvents::synchronize_stream(StreamId stream) {
  const ContextScope in_context(ctx_);
  note_host_wait();
  AF_CU(driver().StreamSynchronize(reinterpret_cast<CUstream>(stream)));
}

bool CudaStreamEvents::is_capturing(StreamId stream) noexcept {
  const ContextScope in_context(ctx_);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  // A failed query (a broken context) is not a capture; the next real call reports the error.
  if (driver().StreamIsCapturing(reinterpret_cast<CUstream>(stream), &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;  // active, or invalidated but not ended yet
}

void CudaStreamEvents::release(uint64_t token) noexcept {
  const ContextScope in_context(ctx_);
  driver().EventDestroy(reinterpret_cast<CUevent>(token));
}

StreamId cuda_stream_create(int device) {
  void* ctx = open_device(device);
  CUstream s = nullptr;
  {
    const ContextScope in_context(ctx);
    AF_CU(driver().StreamCreate(&s, CU_STREAM_NON_BLOCKING));
  }
  close_device(device, ctx);  // the primary context stays alive while any provider holds it
  return reinterpret_cast<StreamId>(s);
}

void cuda_stream_destroy(StreamId stream, int device) noexcept {
  if (driver().StreamDestroy != nullptr) driver().StreamDestroy(reinterpret_cast<CUstream>(stream));
}

void cuda_copy_to_device(void* dst, const void* src, size_t bytes, int device) {
  void* ctx = open_device(device);
  note_host_wait();  // a synchronous copy: the host waits for it
  {
    const ContextScope in_context(ctx);
    AF_CU(driver().MemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes));
  }
  close_device(device, ctx);
}

void cuda_copy_to_host(void* dst, const void* src, size_t bytes, int device) {
  void* ctx = open_device(device);
  note_host_wait();
  {
    const ContextScope in_context(ctx);
    AF_CU(driver().MemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes));
  }
  close_device(device, ctx);
}

#else  // no <cuda.h> at build time

namespace {
[[noreturn]] void no_cuda() {
  AF_THROW(NotImplemented, "CUDA is not available: this build of ampforge did not find the CUDA headers (cuda.h)");
}
}  // namespace

CudaDriverStatus cuda_driver_status() {
  return {false, 0, "this build of ampforge did not find the CUDA headers (cuda.h)"};
}
CudaProvider::CudaProvider(int device) : device_(device) { no_cuda(); }
CudaProvider::~CudaProvider() = default;
size_t CudaProvider::capacity() const { return 0; }
void* CudaProvider::allocate(size_t) { no_cuda(); }
void CudaProvider::deallocate(void*, size_t) noexcept {}
CudaVmmProvider::CudaVmmProvider(int device) : device_(device) { no_cuda(); }
CudaVmmProvider::~CudaVmmProvider() = default;
size_t CudaVmmProvider::capacity() const { return 0; }
void* CudaVmmProvider::allocate(size_t) { no_cuda(); }
void CudaVmmProvider::deallocate(void*, size_t) noexcept {}
void* CudaVmmProvider::reserve(size_t) { no_cuda(); }
void CudaVmmProvider::unreserve(void*, size_t) noexcept {}
std::optional<uint64_t> CudaVmmProvider::create_physical() { no_cuda(); }
void CudaVmmProvider::release_physical(uint64_t) noexcept {}
void CudaVmmProvider::map(void*, uint64_t) { no_cuda(); }
void CudaVmmProvider::unmap(void*) noexcept {}
CudaStreamEvents::CudaStreamEvents(int device) : device_(device) { no_cuda(); }
CudaStreamEvents::~CudaStreamEvents() = default;
uint64_t CudaStreamEvents::record(StreamId) { no_cuda(); }
bool CudaStreamEvents::query(uint64_t) { no_cuda(); }
void CudaStreamEvents::synchronize(uint64_t) { no_cuda(); }
void CudaStreamEvents::release(uint64_t) noexcept {}
void CudaStreamEvents::synchronize_stream(StreamId) { no_cuda(); }
bool CudaStreamEvents::is_capturing(StreamId) noexcept { return false; }
StreamId cuda_stream_create(int) { no_cuda(); }
void cuda_stream_destroy(StreamId, int) noexcept {}
void cuda_copy_to_device(void*, const void*, size_t, int) { no_cuda(); }
void cuda_copy_to_host(void*, const void*, size_t, int) { no_cuda(); }

#endif

}  // namespace ampforge::memory
