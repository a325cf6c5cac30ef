// Finding the GPU and the CUPTI injection library at run time (nothing CUDA is linked into libampforge).
#pragma once

#include <string>
#include <vector>

namespace ampforge::profiler {

struct CudaPresence {
  bool present = false;
  int devices = 0;
  std::string reason;  // why not present: "no GPU / driver (libcuda.so.1 not found)", "cuInit failed: 100", ...
};
// dlopen("libcuda.so.1") + cuInit(0) + cuDeviceGetCount. Cached after the first call.
CudaPresence probe_cuda();

// Path of libampforge_cupti_injection.so: $AMPFORGE_CUPTI_INJECTION when set, else the first candidate below
// that exists, else "" (and "" in a build without the injection library).
std::string cupti_injection_library();
// Where cupti_injection_library() looks, in order: $AMPFORGE_CUPTI_INJECTION; beside a shared libampforge;
// <directory of the program>/../lib (an installed bin/ampforge); the lib/ of the install prefix configured at
// build time; the library's path in the build tree. Without the injection library: only the variable.
std::vector<std::string> cupti_injection_candidates();

// Environment variables shared by `ampforge profile`, the injection library and sessions.
inline constexpr const char* kCuptiOutputEnv = "AMPFORGE_CUPTI_OUTPUT";          // activity file to write
inline constexpr const char* kHostOutputEnv = "AMPFORGE_PROFILE_HOST_OUTPUT";    // a session's host ranges

}  // namespace ampforge::profiler
