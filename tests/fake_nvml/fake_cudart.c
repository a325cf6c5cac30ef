/* A fake CUDA runtime for the doctor tests: reports a runtime version (FAKE_CUDART_VERSION, default 12040 =
 * CUDA 12.4) and sees the GPUs a driver would let it use. It makes the tests independent of whatever CUDA the
 * test machine has.
 *
 * Which devices it sees:
 *   - by default, those of the fake NVML loaded in this process (found with dlopen(RTLD_NOLOAD) of
 *     AMPFORGE_NVML_LIBRARY, initialised by doctor before it asks the runtime), as a real runtime sees the driver's
 *     GPUs: none, with cudaErrorInsufficientDriver, when the driver's CUDA major version is older than the runtime's
 *     (minor-version compatibility lets 13.1 run on a 13.0 driver); none with cudaErrorNoDevice when the driver
 *     has no GPU. Without a fake NVML in the process: no device, cudaErrorInsufficientDriver.
 *   - FAKE_CUDART_DEVICES=N: N devices whatever the driver says (0: none, cudaErrorInsufficientDriver).
 *   - FAKE_CUDART_ERROR=E: none, cudaGetDeviceCount failing with cudaError E (802: an NVSwitch system without its
 *     fabric manager, 100: every GPU hidden, ...), whatever else is set.
 * With a device, the device at any PCI bus id is device 0, memory is host memory, and a copy moves nothing; it
 * returns at once (so doctor's bandwidth check passes however loaded the test machine is), or with
 * FAKE_CUDART_GBPS=R takes the time it would at R GB/s. Two functions tell the fake NVML what a driver would know:
 * fake_cudart_link_busy() while pinned memory is held and host-to-device copies run (the link trains up to its
 * working speed), fake_cudart_has_context() once a device was used (the process is then on the GPU's process
 * list). Test-only code. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInitializationError = 3, cudaErrorInsufficientDriver = 35,
  cudaErrorDevicesUnavailable = 46, cudaErrorNoDevice = 100, cudaErrorInvalidDevice = 101,
  cudaErrorSystemNotReady = 802, cudaErrorSystemDriverMismatch = 803, cudaErrorUnknown = 999
};
enum { kHostToDevice = 1 };

static int g_pinned, g_copies, g_context; /* read by the fake NVML from another thread: __atomic builtins */

static int runtime_version(void) {
  const char* s = getenv("FAKE_CUDART_VERSION");
  return s ? atoi(s) : 12040;
}

/* What the fake NVML of this process says: its device count and the driver's CUDA version; 0 when no initialised
 * fake NVML is loaded. */
static int driver_view(unsigned* count, int* cuda) {
  const char* path = getenv("AMPFORGE_NVML_LIBRARY");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  int ok = 0;
  if (h) {
    int (*get_count)(unsigned*) = (int (*)(unsigned*))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*get_cuda)(int*) = (int (*)(int*))dlsym(h, "nvmlSystemGetCudaDriverVersion");
    ok = get_count && get_count(count) == 0;
    /* An NVML without the query (the partial fake) says nothing against the runtime. */
    if (ok && !(get_cuda && get_cuda(cuda) == 0)) *cuda = runtime_version();
    dlclose(h);
  }
  return ok;
}

/* How many of the driver's `count` GPUs CUDA_VISIBLE_DEVICES leaves: its comma-separated entries up to the first
 * that names no GPU (an index out of range, or not an index nor a GPU-/MIG- UUID), as the real runtime reads it. */
static int visible(int count) {
  const char* v = getenv("CUDA_VISIBLE_DEVICES");
  int n = 0;
  if (!v) return count;
  while (*v) {
    const char* end = v;
    while (*end && *end != ',') ++end;
    if (end > v && *v >= '0' && *v <= '9') {
      if (atoi(v) >= count) break;
    } else if (strncmp(v, "GPU-", 4) != 0 && strncmp(v, "MIG-", 4) != 0) {
      break;
    }
    ++n;
    v = *end ? end + 1 : end;
  }
  return n;
}

/* The devices this runtime sees, and cudaGetDeviceCount's status when it sees none (see the file comment). */
static int devices_status(int* status) {
  const char* err = getenv("FAKE_CUDART_ERROR");
  const char* s = getenv("FAKE_CUDART_DEVICES");
  unsigned count = 0;
  int cuda = 0;
  int n = 0;
  *status = cudaErrorInsufficientDriver;
  if (err && atoi(err) != 0) {
    *status = atoi(err);
    return 0;
  }
  if (s) {
    n = atoi(s);
  } else if (driver_view(&count, &cuda)) {
    if (cuda / 1000 < runtime_version() / 1000) return 0;
    n = visible((int)count);
    *status = cudaErrorNoDevice;
  }
  if (n > 0) *status = cudaSuccess;
  return n;
}
static int devices(void) {
  int status;
  return devices_status(&status);
}
/* Every call that needs a device fails as cudaGetDeviceCount does when there is none. */
#define NEED_DEVICE()                               \
  do {                                              \
    int status_;                                    \
    if (devices_status(&status_) == 0) return status_; \
  } while (0)

int cudaRuntimeGetVersion(int* v) {
  *v = runtime_version();
  return cudaSuccess;
}
int cudaDriverGetVersion(int* v) {
  *v = devices() > 0 ? 13000 : 0;
  return cudaSuccess;
}
int cudaGetDeviceCount(int* n) {
  int status;
  *n = devices_status(&status);
  return status;
}
const char* cudaGetErrorString(int e) {
  switch (e) {
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorSystemNotReady: return "system not yet initialized";
    case cudaErrorSystemDriverMismatch: return "system has unsupported display driver / cuda driver combination";
    default: return "unknown error";
  }
}
int cudaDeviceGetByPCIBusId(int* d, const char* id) {
  NEED_DEVICE();
  if (!d || !id || !*id) return cudaErrorInvalidValue;
  *d = 0;
  return cudaSuccess;
}
int cudaSetDevice(int d) {
  NEED_DEVICE();
  if (d < 0 || d >= devices()) return cudaErrorInvalidDevice;
  __atomic_store_n(&g_context, 1, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaMalloc(void** p, size_t n) {
  NEED_DEVICE();
  *p = malloc(n ? n : 1); /* never touched: the pages are not committed */
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
int cudaFree(void* p) {
  NEED_DEVICE();
  free(p);
  return cudaSuccess;
}
int cudaMallocHost(void** p, size_t n) {
  NEED_DEVICE();
  *p = malloc(n ? n : 1);
  if (!*p) return cudaErrorInvalidValue;
  if (__atomic_fetch_add(&g_pinned, 1, __ATOMIC_SEQ_CST) == 0) __atomic_store_n(&g_copies, 0, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaFreeHost(void* p) {
  NEED_DEVICE();
  free(p);
  __atomic_fetch_sub(&g_pinned, 1, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
int cudaMemcpy(void* d, const void* s, size_t n, int kind) {
  const char* rate = getenv("FAKE_CUDART_GBPS");
  const double gbps = rate ? atof(rate) : 0;
  NEED_DEVICE();
  if (!d || !s) return cudaErrorInvalidValue;
  if (gbps > 0) {
    const double until = now() + (double)n / gbps / 1e9;
    while (now() < until) {
    }
  }
  if (kind == kHostToDevice) __atomic_fetch_add(&g_copies, 1, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaDeviceSynchronize(void) {
  NEED_DEVICE();
  return cudaSuccess;
}

int fake_cudart_link_busy(void) {
  return __atomic_load_n(&g_pinned, __ATOMIC_SEQ_CST) > 0 && __atomic_load_n(&g_copies, __ATOMIC_SEQ_CST) > 0;
}
int fake_cudart_has_context(void) { return __atomic_load_n(&g_context, __ATOMIC_SEQ_CST); }
