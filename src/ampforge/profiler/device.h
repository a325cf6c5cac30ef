// Finding the GPU and the CUPTI injection library at run time (nothing CUDA is linked into libampforge).
#pragma once

#include <string>

namespace ampforge::profiler {

struct CudaPresence {
  bool present = false;
  int devices = 0;
  std::string reason;  // why not present: "no GPU / driver (libcuda.so.1 not found)", "cuInit failed: 100", ...
};
// dlopen("libcuda.so.1") + cuInit(0) + cuDeviceGetCount. Cached after the first call.
CudaPresence probe_cuda();

// Path of libampforge_cupti_injection.so: $AMPFORGE_CUPTI_INJECTION, else the one built with this binary
// (if it exists), else "".
std::string cupti_injection_library();

// Environment variables shared by `ampforge profile`, the injection library and sessions.
inline constexpr const char* kCuptiOutputEnv = "AMPFORGE_CUPTI_OUTPUT";          // activity file to write
inline constexpr const char* kHostOutputEnv = "AMPFORGE_PROFILE_HOST_OUTPUT";    // a session's host ranges

}  // namespace ampforge::profiler
