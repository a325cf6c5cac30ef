#include "ampforge/hw/libraries.h"

#include <cstddef>

#include <fmt/format.h>

#include "ampforge/hw/dynlib.h"
#include "ampforge/hw/versions.h"
#include "ampforge/util/env.h"

namespace ampforge::hw {

namespace {

std::vector<std::string> candidates(const char* env_var, std::vector<std::string> defaults) {
  if (auto p = env_get(env_var); p && !p->empty()) return {*p};
  return defaults;
}

// cuDNN's integer: 8.x encodes 1000*major + 100*minor + patch; 9.x encodes 10000*major + 100*minor + patch.
std::string cudnn_version_string(size_t v) {
  if (v >= 90000) return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

// NCCL_VERSION_CODE: 10000*major + 100*minor + patch from 2.9 on, 1000*major + 100*minor + patch before.
std::string nccl_version_string(int v) {
  if (v >= 20900) return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

LibraryInfo load(const char* name, const std::vector<std::string>& names, DynLib& lib) {
  LibraryInfo info;
  info.name = name;
  lib = DynLib::open_first(names);
  if (!lib.loaded()) {
    info.error = lib.error();
    return info;
  }
  info.found = true;
  info.path = lib.path();
  return info;
}

}  // namespace

std::vector<std::string> cudart_candidates() {
  return candidates("AMPFORGE_CUDART_LIBRARY", {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"});
}

LibrariesReport probe_libraries() {
  LibrariesReport r;
  {
    DynLib lib;
    r.cudart = load("cudart", cudart_candidates(), lib);
    if (lib.loaded()) {
      using VersionFn = int (*)(int*);  // cudaError_t (int*)
      auto rt = lib.function<VersionFn>("cudaRuntimeGetVersion");
      auto drv = lib.function<VersionFn>("cudaDriverGetVersion");
      int v = 0;
      if (rt && rt(&v) == 0) {
        r.runtime_version = v;
        r.cudart.version = cuda_version_string(v);
      } else {
        r.cudart.error = "cudaRuntimeGetVersion failed or is missing";
      }
      int d = 0;
      if (drv && drv(&d) == 0) r.runtime_driver_version = d;
    }
  }
  {
    DynLib lib;
    r.cudnn = load("cudnn", candidates("AMPFORGE_CUDNN_LIBRARY", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}), lib);
    if (lib.loaded()) {
      auto ver = lib.function<size_t (*)()>("cudnnGetVersion");
      auto rt = lib.function<size_t (*)()>("cudnnGetCudartVersion");
      if (ver) r.cudnn.version = cudnn_version_string(ver());
      else r.cudnn.error = "cudnnGetVersion is missing";
      if (rt) r.cudnn.built_for_cuda = static_cast<int>(rt());
    }
  }
  {
    DynLib lib;
    r.cublas = load("cublas", candidates("AMPFORGE_CUBLAS_LIBRARY",
                                         {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}),
                    lib);
    if (lib.loaded()) {
      using PropFn = int (*)(int, int*);  // cublasStatus_t (libraryPropertyType, int*)
      auto prop = lib.function<PropFn>("cublasGetProperty");
      auto rt = lib.function<size_t (*)()>("cublasGetCudartVersion");
      int major = 0, minor = 0, patch = 0;
      if (prop && prop(0, &major) == 0 && prop(1, &minor) == 0 && prop(2, &patch) == 0)
        r.cublas.version = fmt::format("{}.{}.{}", major, minor, patch);
      else
        r.cublas.error = "cublasGetProperty failed or is missing";
      if (rt) r.cublas.built_for_cuda = static_cast<int>(rt());
    }
  }
  {
    DynLib lib;
    r.nccl = load("nccl", candidates("AMPFORGE_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"}), lib);
    if (lib.loaded()) {
      auto ver = lib.function<int (*)(int*)>("ncclGetVersion");  // ncclResult_t (int*)
      int v = 0;
      if (ver && ver(&v) == 0) r.nccl.version = nccl_version_string(v);
      else r.nccl.error = "ncclGetVersion failed or is missing";
    }
  }
  return r;
}

}  // namespace ampforge::hw
