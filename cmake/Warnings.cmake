# Compiler flags shared by every ampforge target (applied through the ampforge_flags interface target).
add_library(ampforge_flags INTERFACE)
target_compile_options(ampforge_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(AMPFORGE_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native AMPFORGE_HAS_MARCH_NATIVE)
  if(AMPFORGE_HAS_MARCH_NATIVE)
    target_compile_options(ampforge_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endif()
if(AMPFORGE_SANITIZE)
  target_compile_options(ampforge_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(ampforge_flags INTERFACE -fsanitize=address,undefined)
endif()
if(AMPFORGE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "AMPFORGE_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++ in a build "
                        "directory of its own, as scripts/fuzz does")
  endif()
  # Coverage for libFuzzer everywhere, ASan + UBSan so a memory or UB error is a finding, not silence.
  target_compile_options(ampforge_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined
    -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(ampforge_flags INTERFACE -fsanitize=address,undefined)
endif()
if(AMPFORGE_TSAN)
  target_compile_options(ampforge_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(ampforge_flags INTERFACE -fsanitize=thread)
endif()
