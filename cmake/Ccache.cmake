# Use ccache when it is installed: CI rebuilds from a clean clone, and the cache survives between runs
# on the same machine.
find_program(AMPFORGE_CCACHE ccache)
if(AMPFORGE_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${AMPFORGE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${AMPFORGE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${AMPFORGE_CCACHE})
endif()
