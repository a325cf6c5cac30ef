#include "ampforge/profiler/device.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>

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

std::vector<std::string> cupti_injection_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("AMPFORGE_CUPTI_INJECTION"); env != nullptr && *env != '\0') out.emplace_back(env);
#ifdef AMPFORGE_CUPTI_INJECTION_PATH
  namespace fs = std::filesystem;
  auto add = [&out](const fs::path& p) {
    std::string s = p.lexically_normal().string();
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  // A shared libampforge: its own directory (an installation's lib/). The link map of the object holding
  // this function has an empty name when that object is the program (a static libampforge).
  Dl_info info{};
  link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(&cupti_injection_candidates), &info, reinterpret_cast<void**>(&map),
                RTLD_DL_LINKMAP) != 0 && map != nullptr && map->l_name != nullptr && map->l_name[0] == '/')
    add(fs::path(map->l_name).parent_path() / AMPFORGE_CUPTI_INJECTION_NAME);
  // The program's <bin>/../lib (an installed bin/ampforge, or a program installed beside it).
  std::error_code ec;
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec && !exe.empty())
    add(exe.parent_path() / AMPFORGE_BIN_TO_LIB / AMPFORGE_CUPTI_INJECTION_NAME);
  add(fs::path(AMPFORGE_INSTALL_FULL_LIBDIR) / AMPFORGE_CUPTI_INJECTION_NAME);  // the configured prefix
  add(AMPFORGE_CUPTI_INJECTION_PATH);                                          // this build tree
#endif
  return out;
}

std::string cupti_injection_library() {
  if (const char* env = std::getenv("AMPFORGE_CUPTI_INJECTION"); env != nullptr && *env != '\0') return env;
  for (const std::string& c : cupti_injection_candidates()) {
    struct stat st {};
    if (::stat(c.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return c;
  }
  return "";
}

}  // namespace ampforge::profiler
