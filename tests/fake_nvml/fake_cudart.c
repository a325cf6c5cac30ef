/* A fake CUDA runtime for the doctor tests: reports a runtime version (FAKE_CUDART_VERSION, default 12040 =
 * CUDA 12.4) and, like a real runtime on a machine without a working driver, no usable device. It makes the
 * tests independent of whatever CUDA the test machine has. Test-only code. */
#include <stdlib.h>

enum { cudaSuccess = 0, cudaErrorInsufficientDriver = 35 };

int cudaRuntimeGetVersion(int* v) {
  const char* s = getenv("FAKE_CUDART_VERSION");
  *v = s ? atoi(s) : 12040;
  return cudaSuccess;
}
int cudaDriverGetVersion(int* v) { *v = 0; return cudaSuccess; }
int cudaGetDeviceCount(int* n) { *n = 0; return cudaErrorInsufficientDriver; }
const char* cudaGetErrorString(int e) {
  return e == cudaErrorInsufficientDriver ? "CUDA driver version is insufficient for CUDA runtime version" : "unknown error";
}
int cudaDeviceGetByPCIBusId(int* d, const char* id) { (void)d; (void)id; return cudaErrorInsufficientDriver; }
int cudaSetDevice(int d) { (void)d; return cudaErrorInsufficientDriver; }
int cudaMalloc(void** p, size_t n) { (void)p; (void)n; return cudaErrorInsufficientDriver; }
int cudaFree(void* p) { (void)p; return cudaErrorInsufficientDriver; }
int cudaMallocHost(void** p, size_t n) { (void)p; (void)n; return cudaErrorInsufficientDriver; }
int cudaFreeHost(void* p) { (void)p; return cudaErrorInsufficientDriver; }
int cudaMemcpy(void* d, const void* s, size_t n, int k) { (void)d; (void)s; (void)n; (void)k; return cudaErrorInsufficientDriver; }
int cudaDeviceSynchronize(void) { return cudaErrorInsufficientDriver; }
