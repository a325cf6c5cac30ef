# `cmake --install build --prefix P`: what an installation holds (docs/ARCHITECTURE.md, "Build and install").
#   include/ampforge/...          the public headers (src/ampforge/**/*.h without the tests' helpers, the CLI's
#                                 header and the CUDA backend's internal ones) + the generated util/build_info.h
#   lib/libampforge.a (.so.*)     the library
#   lib/libampforge_cupti_injection.so   the CUPTI injection library, when built (found by profiler/device.cpp)
#   bin/ampforge                  the CLI
#   lib/cmake/ampforge/           the CMake package: find_package(ampforge CONFIG) -> ampforge::ampforge
#   lib/pkgconfig/ampforge.pc     the pkg-config file
# The dependencies the package finds again are the ampforge_package_dependency() list in
# cmake/Dependencies.cmake. tests/install/ installs into a temporary prefix and builds examples/ against it.
include(CMakePackageConfigHelpers)

set(AMPFORGE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ampforge)

# Headers. Left out: *_testutil.h / *_test_util.h and profiler/trace_check.h (helpers of the tests), cli/ (the
# executable's own header, which needs CLI11), and the CUDA backend's internal headers (runtime.h includes the
# toolkit's cuda_runtime_api.h; register.h and plan.h are used only inside backends/cuda/). The public CUDA
# interface, backends/cuda/cuda.h, includes no CUDA header and is installed. The install test checks that
# every "ampforge/..." include of an installed header is installed too.
file(GLOB_RECURSE AMPFORGE_PUBLIC_HEADERS CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/src
     ${PROJECT_SOURCE_DIR}/src/ampforge/*.h)
list(FILTER AMPFORGE_PUBLIC_HEADERS EXCLUDE REGEX "_test_?util\\.h$")
list(FILTER AMPFORGE_PUBLIC_HEADERS EXCLUDE REGEX "^ampforge/profiler/trace_check\\.h$")
list(FILTER AMPFORGE_PUBLIC_HEADERS EXCLUDE REGEX "^ampforge/cli/")
list(FILTER AMPFORGE_PUBLIC_HEADERS EXCLUDE REGEX "^ampforge/backends/cuda/(runtime|register|plan)\\.h$")
foreach(header ${AMPFORGE_PUBLIC_HEADERS})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/src/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/src/generated/ampforge/util/build_info.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ampforge/util)

# The library (exported), the CLI and the CUPTI injection library (a plugin: installed, not exported).
install(TARGETS ampforge EXPORT ampforgeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ampforge_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${PROJECT_SOURCE_DIR}/bench/peer/torch_bench_peer.py DESTINATION ${CMAKE_INSTALL_DATADIR}/ampforge/peer)
if(TARGET ampforge_cupti_injection)
  set_target_properties(ampforge_cupti_injection PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)  # libcupti
  install(TARGETS ampforge_cupti_injection LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# The CMake package.
install(EXPORT ampforgeTargets NAMESPACE ampforge:: DESTINATION ${AMPFORGE_INSTALL_CMAKEDIR})
get_property(AMPFORGE_CONFIG_PUBLIC GLOBAL PROPERTY AMPFORGE_CONFIG_PUBLIC)
get_property(AMPFORGE_CONFIG_PRIVATE GLOBAL PROPERTY AMPFORGE_CONFIG_PRIVATE)
set(AMPFORGE_CONFIG_CUPTI_INJECTION "")
if(TARGET ampforge_cupti_injection)
  set(AMPFORGE_CONFIG_CUPTI_INJECTION "\${PACKAGE_PREFIX_DIR}/${CMAKE_INSTALL_LIBDIR}/${CMAKE_SHARED_LIBRARY_PREFIX}ampforge_cupti_injection${CMAKE_SHARED_LIBRARY_SUFFIX}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ampforgeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/ampforgeConfig.cmake
  INSTALL_DESTINATION ${AMPFORGE_INSTALL_CMAKEDIR})
if(PROJECT_VERSION_MAJOR EQUAL 0)  # 0.x: every minor version may break the API
  set(_af_compat SameMinorVersion)
else()
  set(_af_compat SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/ampforgeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${_af_compat})
install(FILES ${PROJECT_BINARY_DIR}/package/ampforgeConfig.cmake ${PROJECT_BINARY_DIR}/package/ampforgeConfigVersion.cmake
        DESTINATION ${AMPFORGE_INSTALL_CMAKEDIR})

# The pkg-config file. Relocatable (paths from ${pcfiledir}), so `--prefix P` at install time is honoured.
get_property(_af_req_public GLOBAL PROPERTY AMPFORGE_PC_REQUIRES_PUBLIC)
get_property(_af_req_private GLOBAL PROPERTY AMPFORGE_PC_REQUIRES_PRIVATE)
get_property(_af_libs_public GLOBAL PROPERTY AMPFORGE_PC_LIBS_PUBLIC)
get_property(_af_libs_private GLOBAL PROPERTY AMPFORGE_PC_LIBS_PRIVATE)
list(JOIN _af_req_public " " AMPFORGE_PC_REQUIRES)
list(JOIN _af_req_private " " AMPFORGE_PC_REQUIRES_PRIVATE)
if(AMPFORGE_SANITIZE)  # as the installed target's link options (src/CMakeLists.txt)
  list(APPEND _af_libs_public -fsanitize=address,undefined)
elseif(AMPFORGE_TSAN)
  list(APPEND _af_libs_public -fsanitize=thread)
endif()
list(JOIN _af_libs_public " " AMPFORGE_PC_LIBS)
list(JOIN _af_libs_private " " AMPFORGE_PC_LIBS_PRIVATE)
set(AMPFORGE_PC_CFLAGS "")
if(AMPFORGE_WITH_CUDA)
  set(AMPFORGE_PC_CFLAGS " -DAMPFORGE_WITH_CUDA")
endif()
file(RELATIVE_PATH AMPFORGE_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" AMPFORGE_PC_TO_PREFIX "${AMPFORGE_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ampforge.pc.in ${PROJECT_BINARY_DIR}/package/ampforge.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/ampforge.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
