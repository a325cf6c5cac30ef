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
#  - MPI (Open MPI: libopenmpi-dev, openmpi-bin): the collectives of CPU data-parallel ranks, and the
#    bootstrap of ranks started by mpirun / srun (dist/mpi_communicator.h). The engine CPU clusters already
#    run, and the way to test every distributed code path on one machine. Optional (AMPFORGE_MPI=AUTO: on
#    when found; scripts/setup installs it, so CI has it); without it, data parallel runs on GPUs (NCCL,
#    loaded at run time) only.
#  - oneDNN (libdnnl-dev): the CPU convolutions (forward, input and weight gradients) of
#    backends/cpu/conv_onednn.cpp: direct AVX-512 / AVX512_BF16 / AMX kernels chosen for the running CPU,
#    where im2col + OpenBLAS spends its time packing columns and converting BF16 to F32. The library PyTorch's
#    CPU convolutions run on (Debian's PyTorch 1.13 links this very libdnnl 2.6). Optional
#    (AMPFORGE_ONEDNN=AUTO: on when found; scripts/setup installs it): without it convolutions run on
#    im2col + OpenBLAS. Debian builds it on OpenMP (libgomp), so libgomp is linked too: ampforge sets
#    oneDNN's thread count through omp_set_num_threads.
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
set(AMPFORGE_WITH_MPI OFF)
if(NOT AMPFORGE_MPI STREQUAL "OFF")
  if(AMPFORGE_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS C)
  else()
    find_package(MPI QUIET COMPONENTS C)
  endif()
  if(MPI_C_FOUND)
    set(AMPFORGE_WITH_MPI ON)
    # Where mpirun is: the tests start ranks with it (the CLI finds it on PATH at run time).
    get_filename_component(_af_mpi_bin "${MPI_C_COMPILER}" DIRECTORY)
    find_program(AMPFORGE_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE} ${_af_mpi_bin})
  endif()
endif()
message(STATUS "ampforge: MPI ${AMPFORGE_WITH_MPI} ${MPI_C_VERSION}")
# oneDNN: Debian's libdnnl-dev ships a CMake package (DNNL::dnnl; its config also finds OpenCL, the GPU
# runtime Debian built it with) and no pkg-config file. Only the OpenMP CPU runtime is supported here:
# conv_onednn.cpp sets the thread count with omp_set_num_threads (a threadpool or TBB build would need
# another hook), so a build on another runtime is treated as not found.
set(AMPFORGE_WITH_ONEDNN OFF)
set(_af_onednn_why "AMPFORGE_ONEDNN=OFF")
if(NOT AMPFORGE_ONEDNN STREQUAL "OFF")
  # dnnl-config.cmake calls find_package(OpenCL REQUIRED) when oneDNN was built with the OCL GPU runtime
  # (Debian's is): without OpenCL's headers that is a fatal configure error, not a QUIET miss. Look first, so a
  # machine without ocl-icd-opencl-dev builds without oneDNN and says why.
  set(_af_onednn_why "")
  find_file(_af_dnnl_config dnnl-config.cmake PATH_SUFFIXES lib/cmake/dnnl lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/dnnl)
  if(_af_dnnl_config)
    file(STRINGS "${_af_dnnl_config}" _af_dnnl_ocl REGEX "set\\(DNNL_GPU_RUNTIME \"OCL\"\\)")
    if(_af_dnnl_ocl)
      find_package(OpenCL QUIET)
      if(NOT OpenCL_FOUND)
        set(_af_onednn_why "oneDNN's CMake package needs OpenCL headers and loader (apt-get install ocl-icd-opencl-dev)")
      endif()
    endif()
  endif()
  if(_af_onednn_why STREQUAL "")
    find_package(dnnl 2.6 CONFIG QUIET)
    if(NOT dnnl_FOUND)
      set(_af_onednn_why "libdnnl-dev (dnnl CMake package >= 2.6) not found")
    elseif(NOT DNNL_CPU_RUNTIME STREQUAL "OMP")
      set(_af_onednn_why "oneDNN ${dnnl_VERSION} uses the ${DNNL_CPU_RUNTIME} CPU runtime; ampforge supports OMP")
    else()
      find_package(OpenMP COMPONENTS CXX)
      if(NOT OpenMP_gomp_LIBRARY)
        set(_af_onednn_why "libgomp (OpenMP runtime of oneDNN) not found")
      endif()
    endif()
  endif()
  if(_af_onednn_why STREQUAL "")
    set(AMPFORGE_WITH_ONEDNN ON)
  elseif(AMPFORGE_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "AMPFORGE_ONEDNN=ON: ${_af_onednn_why}")
  endif()
endif()
if(AMPFORGE_WITH_ONEDNN)
  message(STATUS "ampforge: oneDNN CPU convolutions ON ${dnnl_VERSION}")
else()
  message(STATUS "ampforge: oneDNN CPU convolutions OFF (${_af_onednn_why}; im2col + BLAS instead)")
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

# cuDNN (conv2d and its backward ops, backends/cuda/conv.cpp): looked for beside the toolkit (where the
# tarball or the distribution packages put it) and in the system paths; version 9 or later (the status
# codes conv.cpp reads). Found: AMPFORGE_WITH_CUDNN is ON and src/CMakeLists.txt links it shared. Not found:
# the backend still builds; conv.cpp then registers no kernel (conv2d on CUDA raises NotImplemented) and
# `ampforge info` says so. -DAMPFORGE_CUDNN_LIBRARY=... and -DAMPFORGE_CUDNN_INCLUDE_DIR=... point at
# another installation.
set(AMPFORGE_WITH_CUDNN OFF)
if(AMPFORGE_WITH_CUDA)
  find_path(AMPFORGE_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_TARGET_DIR}/include)
  find_library(AMPFORGE_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}/lib64
               ${CUDAToolkit_TARGET_DIR}/lib)
  set(_af_cudnn_major 0)
  if(AMPFORGE_CUDNN_INCLUDE_DIR AND EXISTS ${AMPFORGE_CUDNN_INCLUDE_DIR}/cudnn_version.h)
    file(STRINGS ${AMPFORGE_CUDNN_INCLUDE_DIR}/cudnn_version.h _af_cudnn_major_line REGEX "^#define CUDNN_MAJOR ")
    string(REGEX REPLACE "^#define CUDNN_MAJOR +([0-9]+).*" "\\1" _af_cudnn_major "${_af_cudnn_major_line}")
  endif()
  if(AMPFORGE_CUDNN_INCLUDE_DIR AND AMPFORGE_CUDNN_LIBRARY AND _af_cudnn_major GREATER_EQUAL 9)
    set(AMPFORGE_WITH_CUDNN ON)
    message(STATUS "ampforge: cuDNN ${_af_cudnn_major} (${AMPFORGE_CUDNN_LIBRARY})")
  else()
    message(STATUS "ampforge: cuDNN >= 9 not found: conv2d will have no CUDA kernel")
  endif()
endif()

# ---------------------------------------------------------------------------------------------------------
# What the installed package needs found again (cmake/Install.cmake turns this list into the
# find_dependency() calls of ampforgeConfig.cmake and the Requires/Libs lines of ampforge.pc). One entry per
# dependency that libampforge links; PUBLIC ones (in the link interface of every build) are found by every
# consumer, PRIVATE ones only when libampforge is static (a shared libampforge carries them itself).
#   FIND <package> [args...]  find_dependency(<package> args...) in the config: the package that provides the
#                             imported target linked in src/CMakeLists.txt (ZLIB for ZLIB::ZLIB)
#   PKG <prefix> <module>     pkg_check_modules(<prefix> IMPORTED_TARGET <module>) in the config
#                             (PkgConfig::<prefix>), and <module> in Requires(.private) of ampforge.pc
#   PC <module>...            pkg-config modules for Requires(.private) of ampforge.pc
#   FILE <path>               a library linked by path: the config checks it is still there; on Libs(.private)
#   LIBS <flags>...           flags for Libs(.private) of ampforge.pc (libraries without a .pc file)
# A new private dependency of libampforge (find_package + target_link_libraries(ampforge PRIVATE ...)) adds
# one line here, e.g. ampforge_package_dependency(PRIVATE FIND JPEG PC libjpeg). The install test
# (tests/install/) fails when an entry is missing: the examples then do not configure or link.
function(ampforge_package_dependency scope)
  cmake_parse_arguments(PARSE_ARGV 1 dep "" "FILE" "FIND;PKG;PC;LIBS")
  if(NOT scope MATCHES "^(PUBLIC|PRIVATE)$" OR dep_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "ampforge_package_dependency(${scope} ${ARGN}): expected PUBLIC|PRIVATE and FIND/PKG/PC/FILE/LIBS")
  endif()
  set(code "")
  set(pc ${dep_PC})
  if(dep_FIND)
    list(JOIN dep_FIND " " args)
    string(APPEND code "find_dependency(${args})\n")
  endif()
  if(dep_PKG)
    list(GET dep_PKG 0 prefix)
    list(GET dep_PKG 1 module)
    string(APPEND code "find_dependency(PkgConfig)\n"
                       "pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${module})\n"
                       "if(NOT ${prefix}_FOUND)\n"
                       "  set(ampforge_NOT_FOUND_MESSAGE \"pkg-config module ${module} (PkgConfig::${prefix}) not found\")\n"
                       "  set(ampforge_FOUND FALSE)\n  return()\nendif()\n")
    list(APPEND pc ${module})
  endif()
  set(libs ${dep_LIBS})
  if(dep_FILE)
    string(APPEND code "if(NOT EXISTS \"${dep_FILE}\")\n"
                       "  set(ampforge_NOT_FOUND_MESSAGE \"${dep_FILE}, which libampforge was linked with, is missing\")\n"
                       "  set(ampforge_FOUND FALSE)\n  return()\nendif()\n")
    list(APPEND libs ${dep_FILE})
  endif()
  set_property(GLOBAL APPEND_STRING PROPERTY AMPFORGE_CONFIG_${scope} "${code}")
  set_property(GLOBAL APPEND PROPERTY AMPFORGE_PC_REQUIRES_${scope} ${pc})
  set_property(GLOBAL APPEND PROPERTY AMPFORGE_PC_LIBS_${scope} ${libs})
endfunction()

ampforge_package_dependency(PUBLIC  FIND fmt PC fmt)
ampforge_package_dependency(PUBLIC  FIND nlohmann_json 3.10 PC nlohmann_json)
ampforge_package_dependency(PUBLIC  FIND Threads LIBS -pthread)
ampforge_package_dependency(PRIVATE PKG OPENBLAS openblas)
ampforge_package_dependency(PRIVATE FIND ZLIB PC zlib)
ampforge_package_dependency(PRIVATE FIND JPEG PC libjpeg)
ampforge_package_dependency(PRIVATE FIND PNG PC libpng)
if(SLEEF_FOUND)
  ampforge_package_dependency(PRIVATE PKG SLEEF sleef)
endif()
if(CMAKE_DL_LIBS)
  ampforge_package_dependency(PRIVATE LIBS -l${CMAKE_DL_LIBS})
endif()
if(AMPFORGE_WITH_CUDA)  # CUDA::cudart, CUDA::cublasLt (shared)
  ampforge_package_dependency(PRIVATE FIND CUDAToolkit ${CUDAToolkit_VERSION_MAJOR}
                              LIBS -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lcublasLt)
endif()
if(AMPFORGE_WITH_CUDNN)
  ampforge_package_dependency(PRIVATE FILE ${AMPFORGE_CUDNN_LIBRARY})
endif()
if(AMPFORGE_WITH_ONEDNN)  # DNNL::dnnl (shared) and libgomp by file (src/CMakeLists.txt)
  ampforge_package_dependency(PRIVATE FIND dnnl ${dnnl_VERSION} CONFIG LIBS -ldnnl)
  ampforge_package_dependency(PRIVATE FILE ${OpenMP_gomp_LIBRARY})
endif()
if(AMPFORGE_WITH_MPI)  # libmpi linked by file (src/CMakeLists.txt says why)
  foreach(_af_mpi_lib ${MPI_C_LIBRARIES})
    ampforge_package_dependency(PRIVATE FILE ${_af_mpi_lib})
  endforeach()
endif()
