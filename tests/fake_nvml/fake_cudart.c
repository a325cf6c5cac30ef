/* A fake CUDA runtime for the doctor tests: reports a runtime version (FAKE_CUDART_VERSION, default 12040 =
 * CUDA 12.4) and, like a real runtime on a machine without a working driver, no usable device. It makes the
 * tests independent of whatever CUDA the test machine has.
 *
 * FAKE_CUDART_DEVICES=N (N >= 1) plays a runtime that sees N GPUs instead, so that doctor's path on a machine
 * with a GPU runs here too: the device at any PCI bus id is device 0, memory is host memory, and a copy moves
 * nothing but takes the time it would at FAKE_CUDART_GBPS (default 50) GB/s. Two functions tell the fake NVML
 * (which finds them with dlopen(RTLD_NOLOAD) of AMPFORGE_CUDART_LIBRARY) what a driver would know:
 * fake_cudart_link_busy() while pinned memory is held and host-to-device copies run (the link trains up to its
 * working speed), fake_cudart_has_context() once a device was used (the process is then on the GPU's process
 * list). Test-only code. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdlib.h>
#include <time.h>

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInsufficientDriver = 35, cudaErrorInvalidDevice = 101 };
enum { kHostToDevice = 1 };

static int g_pinned, g_copies, g_context; /* read by the fake NVML from another thread: __atomic builtins */

static int devices(void) {
  const char* s = getenv("FAKE_CUDART_DEVICES");
  return s ? atoi(s) : 0;
}

int cudaRuntimeGetVersion(int* v) {
  const char* s = getenv("FAKE_CUDART_VERSION");
  *v = s ? atoi(s) : 12040;
  return cudaSuccess;
}
int cudaDriverGetVersion(int* v) {
  *v = devices() > 0 ? 13000 : 0;
  return cudaSuccess;
}
int cudaGetDeviceCount(int* n) {
  *n = devices();
  return *n > 0 ? cudaSuccess : cudaErrorInsufficientDriver;
}
const char* cudaGetErrorString(int e) {
  switch (e) {
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidValue: return "invalid argument";
    default: return "unknown error";
  }
}
int cudaDeviceGetByPCIBusId(int* d, const char* id) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
  if (!d || !id || !*id) return cudaErrorInvalidValue;
  *d = 0;
  return cudaSuccess;
}
int cudaSetDevice(int d) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
  if (d < 0 || d >= devices()) return cudaErrorInvalidDevice;
  __atomic_store_n(&g_context, 1, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaMalloc(void** p, size_t n) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
  *p = malloc(n ? n : 1); /* never touched: the pages are not committed */
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
int cudaFree(void* p) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
  free(p);
  return cudaSuccess;
}
int cudaMallocHost(void** p, size_t n) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
  *p = malloc(n ? n : 1);
  if (!*p) return cudaErrorInvalidValue;
  if (__atomic_fetch_add(&g_pinned, 1, __ATOMIC_SEQ_CST) == 0) __atomic_store_n(&g_copies, 0, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaFreeHost(void* p) {
  if (devices() == 0) return cudaErrorInsufficientDriver;
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
  const double gbps = rate && atof(rate) > 0 ? atof(rate) : 50.0;
  double until;
  if (devices() == 0) return cudaErrorInsufficientDriver;
  if (!d || !s) return cudaErrorInvalidValue;
  until = now() + (double)n / gbps / 1e9;
  while (now() < until) {
  }
  if (kind == kHostToDevice) __atomic_fetch_add(&g_copies, 1, __ATOMIC_SEQ_CST);
  return cudaSuccess;
}
int cudaDeviceSynchronize(void) { return devices() > 0 ? cudaSuccess : cudaErrorInsufficientDriver; }

int fake_cudart_link_busy(void) {
  return __atomic_load_n(&g_pinned, __ATOMIC_SEQ_CST) > 0 && __atomic_load_n(&g_copies, __ATOMIC_SEQ_CST) > 0;
}
int fake_cudart_has_context(void) { return __atomic_load_n(&g_context, __ATOMIC_SEQ_CST); }
