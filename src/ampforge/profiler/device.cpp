#include "ampforge/profiler/device.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

namespace ampforge::profiler {

CudaPresence probe_cuda() {
  static CudaPresence cached;
  static std::once_flag once;
  std::call_once(once, [] {
    // The handle stays open: unloading the driver library after cuInit is not supported.
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      cached.reason = "no GPU / driver (libcuda.so.1 could not be loaded)";
      return;
    }
    using InitFn = int (*)(unsigned);
    using CountFn = int (*)(int*);
    auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
    auto count = reinterpret_cast<CountFn>(dlsym(h, "cuDeviceGetCount"));
    if (init == nullptr || count == nullptr) {
      cached.reason = "no GPU / driver (libcuda.so.1 lacks cuInit)";
      return;
    }
    if (int rc = init(0); rc != 0) {
      cached.reason = fmt::format("no GPU / driver (cuInit failed with CUresult {})", rc);
      return;
    }
    int n = 0;
    if (count(&n) != 0 || n == 0) {
      cached.reason = "no GPU / driver (the driver reports no CUDA device)";
      return;
    }
    cached.present = true;
    cached.devices = n;
  });
  return cached;
}

std::string cupti_injection_library() {
  if (const char* env = std::getenv("AMPFORGE_CUPTI_INJECTION"); env != nullptr && *env != '\0') return env;
#ifdef AMPFORGE_CUPTI_INJECTION_PATH
  struct stat st {};
  if (::stat(AMPFORGE_CUPTI_INJECTION_PATH, &st) == 0) return AMPFORGE_CUPTI_INJECTION_PATH;
#endif
  return "";
}

}  // namespace ampforge::profiler
