# The libFuzzer targets of the input readers (tests/fuzz/fuzz_*.cpp; docs/fuzzing.md), built with
# -DPARITY_FUZZ=ON by clang only. Every parity library is then compiled with libFuzzer's coverage
# instrumentation (-fsanitize=fuzzer-no-link) and AddressSanitizer + UndefinedBehaviorSanitizer
# (UB ends the process: -fno-sanitize-recover), and each target links libFuzzer's main. Such a
# build is sanitized throughout, so it lives in a directory of its own: tests/fuzz/run.sh
# configures one (ctest fuzz.readers) and builds only the target fuzz_targets. Included from the
# top-level CMakeLists.txt after the host modules.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "PARITY_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
endif()

set(_parity_sanitize address,undefined)
target_compile_options(parity_options INTERFACE -fsanitize=fuzzer-no-link,${_parity_sanitize}
                       -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
target_link_options(parity_options INTERFACE -fsanitize=${_parity_sanitize})
# clang warns of what g++ does not: ShardReader's split_ is stored and never read.
target_compile_options(parity_options INTERFACE -Wno-unused-private-field)

# Each target with the libraries its reader is in.
set(_parity_fuzz_libs_fuzz_model_spec parity_spec)
set(_parity_fuzz_libs_fuzz_device_spec parity_spec)
set(_parity_fuzz_libs_fuzz_plan_json parity_plan)
set(_parity_fuzz_libs_fuzz_shards parity_data)
set(_parity_fuzz_libs_fuzz_sequence_shards parity_data)
set(_parity_fuzz_libs_fuzz_criteo parity_data)
set(_parity_fuzz_libs_fuzz_checkpoint parity_train)

add_custom_target(fuzz_targets)
file(GLOB _parity_fuzz_src CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_*.cpp)
foreach(src IN LISTS _parity_fuzz_src)
  get_filename_component(name ${src} NAME_WE)
  if(NOT DEFINED _parity_fuzz_libs_${name})
    message(FATAL_ERROR "cmake/ParityFuzz.cmake: say which libraries ${name} links")
  endif()
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE parity_options ${_parity_fuzz_libs_${name}})
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  target_compile_definitions(${name} PRIVATE PARITY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  add_dependencies(fuzz_targets ${name})
endforeach()
