// The CUDA user-space libraries present on this machine, found with dlopen and asked for their versions
// through their documented version functions (none needs a GPU):
//   cudart  cudaRuntimeGetVersion, cudaDriverGetVersion
//   cuDNN   cudnnGetVersion, cudnnGetCudartVersion
//   cuBLAS  cublasGetProperty(MAJOR/MINOR/PATCH), cublasGetCudartVersion
//   NCCL    ncclGetVersion
// Each library's file can be overridden by an environment variable (AMPFORGE_CUDART_LIBRARY,
// AMPFORGE_CUDNN_LIBRARY, AMPFORGE_CUBLAS_LIBRARY, AMPFORGE_NCCL_LIBRARY), e.g. to check another install.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ampforge::hw {

struct LibraryInfo {
  std::string name;                  // "cudart", "cudnn", "cublas", "nccl"
  bool found = false;
  std::string path;                  // the file that was loaded
  std::string version;               // "9.1.0"
  std::optional<int> built_for_cuda;  // CUDA version the library was built for (1000*major + 10*minor)
  std::string error;                 // why it was not found / why the version is unknown
};

struct LibrariesReport {
  LibraryInfo cudart, cudnn, cublas, nccl;
  std::optional<int> runtime_version;       // cudaRuntimeGetVersion
  std::optional<int> runtime_driver_version;  // cudaDriverGetVersion (0 when no driver is installed)
};

// Names tried for the CUDA runtime: the override, else libcudart.so.13, .12, .11, libcudart.so.
std::vector<std::string> cudart_candidates();

LibrariesReport probe_libraries();

}  // namespace ampforge::hw
