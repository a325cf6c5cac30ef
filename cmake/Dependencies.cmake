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
#  - libjpeg-turbo through the libjpeg API (libjpeg62-turbo-dev) and libpng (libpng-dev): JPEG and PNG
#    decoding for image-folder datasets (data/image.cpp). The libjpeg API rather than TurboJPEG
#    (libturbojpeg0-dev): it tells which warning fired (msg_code), so a truncated file is refused while
#    harmless corruption warnings are not, and it says whether a CMYK file carries the Adobe marker
#    (inverted CMYK), which TurboJPEG 2.1's API does not expose. Speed is the same (one libjpeg-turbo SIMD
#    decoder underneath, DCT-domain downscaling in both); the price is libjpeg's setjmp/longjmp error
#    contract, handled once in data/image.cpp. libpng: the reference PNG decoder (PIL links it too); its
#    low-level API does the palette, grayscale and 16-bit conversions.
#  - GoogleTest / Google Benchmark: tests and micro-benchmarks.
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(SLEEF QUIET IMPORTED_TARGET sleef)
message(STATUS "ampforge: SLEEF vectorised math ${SLEEF_FOUND}")
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(JPEG REQUIRED)
find_package(PNG REQUIRED)
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

# The CUDA backend (src/ampforge/backends/cuda/): the language, the toolkit's imported targets, and the
# architectures to compile for. CMAKE_CUDA_ARCHITECTURES must be known before enable_language(CUDA), or
# CMake picks nvcc's oldest default. Our default: `native` when this machine has a GPU (the build is for
# here), else a short list so that a cold CI build stays cheap: 89 (RTX 40 series, Ada) and 90 (Hopper).
# Each entry embeds SASS and PTX, so newer GPUs still run the kernels through the driver's JIT.
if(AMPFORGE_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR "${CMAKE_CUDA_ARCHITECTURES}" STREQUAL "")
    set(_af_cuda_arch "89;90")
    find_program(AMPFORGE_NVIDIA_SMI nvidia-smi)
    if(AMPFORGE_NVIDIA_SMI)
      execute_process(COMMAND ${AMPFORGE_NVIDIA_SMI} -L RESULT_VARIABLE _af_smi_rc OUTPUT_VARIABLE _af_smi_out
                      ERROR_QUIET TIMEOUT 30)
      if(_af_smi_rc EQUAL 0 AND _af_smi_out MATCHES "GPU [0-9]+:")
        set(_af_cuda_arch native)
      endif()
    endif()
    set(CMAKE_CUDA_ARCHITECTURES "${_af_cuda_arch}" CACHE STRING
        "CUDA architectures (default: native with a GPU at configure time, else 89;90)")
  endif()
  enable_language(CUDA)
  # CMake < 3.26 does not know nvcc's C++20 flag (nvcc >= 12 has it). The .cu files include ampforge's
  # C++20 headers, and CMake applies the targets' CXX_STANDARD 20 to CUDA sources too: teach it the flag.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  # One CUDA runtime in the process: the shared one that libampforge links (CUDA::cudart). CMake's default
  # would add the static runtime to every link that contains CUDA objects as well.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "ampforge: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
message(STATUS "ampforge: CUDA backend ${AMPFORGE_WITH_CUDA}")
