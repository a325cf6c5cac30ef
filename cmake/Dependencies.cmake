# Third-party dependencies, all from Debian packages (scripts/setup installs them). Why each one:
#  - OpenBLAS (libopenblas-dev): the CPU GEMM behind matmul, linear and im2col convolution. Tuned
#    kernels for every x86 generation; the same BLAS PyTorch's Debian build uses, so benches compare
#    kernels, not BLAS choices.
#  - fmt: type-safe formatting for messages and tables (std::format is not in GCC 12).
#  - CLI11: subcommands, --help, strict option parsing for the ampforge CLI.
#  - nlohmann-json: --json output, snapshots, safetensors headers.
#  - zlib: gzip-compressed IDX files (Fashion-MNIST ships .gz).
#  - SLEEF (libsleef-dev): vectorised exp/log/tanh/erf for the CPU elementwise and softmax kernels (the
#    same library PyTorch's CPU kernels vectorise with). Optional: without it those loops call std::.
#  - GoogleTest / Google Benchmark: tests and micro-benchmarks.
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(SLEEF QUIET IMPORTED_TARGET sleef)
message(STATUS "ampforge: SLEEF vectorised math ${SLEEF_FOUND}")
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
if(AMPFORGE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(AMPFORGE_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# CUDA: optional. AUTO turns it on when nvcc is found.
set(AMPFORGE_WITH_CUDA OFF)
if(NOT AMPFORGE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(AMPFORGE_WITH_CUDA ON)
  elseif(AMPFORGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "AMPFORGE_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "ampforge: CUDA backend ${AMPFORGE_WITH_CUDA}")
