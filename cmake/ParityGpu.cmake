# The GPU parts of the build: the portable GPU backend (src/backend/gpu/*.cu) for CUDA and/or
# HIP, its tests (tests/gpu) and benchmarks (bench/), and the CI check that compiles every kernel
# for AMD with hipcc. Included from the top-level CMakeLists.txt after the host modules.
#
# - cuda in PARITY_ENABLED_BACKENDS: enables the CUDA language, builds parity_backend_gpu for
#   PARITY_CUDA_GENCODE (default sm_90a: H100/H200), with -lineinfo and -Xptxas --warn-on-spills,
#   host code at -Wall -Wextra -Werror; test_backend_gpu (skips where no GPU is present),
#   embedding_bench and dense_bench; test_engine's engine tests then run on the cuda backend too.
# - hip in PARITY_ENABLED_BACKENDS: the same .cu files compiled with hipcc for PARITY_HIP_ARCHS
#   into parity_backend_hip. CMake 3.25's HIP language cannot use Debian 12's ROCm packages (it
#   looks for hip-lang under /usr/lib/cmake, Debian installs it under the multiarch directory and
#   lacks amd_comgr's CMake package), so hipcc is driven directly.
# - Always, when tests are built: ctest gpu.hip_compile compiles each .cu with hipcc for
#   gfx90a and gfx940 (skipped, with a message, where hipcc is not installed).

# Kernels and their launchers are .cu; host-only parts (runtime handles, layouts, workspace) are
# .cpp, compiled by the host compiler (nvcc's C++20 front end rejects some of libstdc++ and fmt).
file(GLOB PARITY_GPU_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/gpu/*.cu
     ${PROJECT_SOURCE_DIR}/src/backend/gpu/*.cpp)
file(GLOB PARITY_GPU_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/gpu/*.h
     ${PROJECT_SOURCE_DIR}/src/backend/gpu/*.cuh)

set(PARITY_HIP_ARCHS "gfx90a;gfx940" CACHE STRING "AMD GPU targets for the HIP build and check")

# ---- CUDA --------------------------------------------------------------------------------------
if("cuda" IN_LIST PARITY_ENABLED_BACKENDS)
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_parity_nvcc nvcc HINTS /usr/local/cuda/bin REQUIRED)
    set(CMAKE_CUDA_COMPILER ${_parity_nvcc})
  endif()
  # Architectures are passed as explicit -gencode flags (sm_90a needs the -gencode form).
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ has it); targets inherit CXX_STANDARD 20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(PARITY_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING
      "nvcc -gencode flags (add -gencode=arch=compute_90,code=compute_90 for PTX that later GPUs can run)")
  separate_arguments(_parity_gencode UNIX_COMMAND "${PARITY_CUDA_GENCODE}")

  add_library(parity_backend_gpu STATIC ${PARITY_GPU_SOURCES})
  # parity_core only for linking: its interface adds host-compiler flags that nvcc does not take;
  # the equivalents are passed to the host compiler below.
  target_link_libraries(parity_backend_gpu PUBLIC $<LINK_ONLY:parity_core> $<LINK_ONLY:parity_select> fmt::fmt
                        CUDA::cudart_static)
  target_include_directories(parity_backend_gpu PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(parity_backend_gpu PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${_parity_gencode} -lineinfo -Xptxas=--warn-on-spills
      -Xcompiler=-Wall,-Wextra,-Werror>
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-error=deprecated-declarations>)
  set_target_properties(parity_backend_gpu PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
  # Kernels on warpgroup products (wgmma) exist only in sm_90a code: the host launches them only then.
  if(PARITY_CUDA_GENCODE MATCHES "sm_90a")
    target_compile_definitions(parity_backend_gpu PRIVATE PARITY_CUDA_SM90A=1)
  endif()
  # The synthetic data's math must round as on the host: no fused multiply-adds (parity/detmath.h).
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/backend/gpu/synthetic.cu PROPERTIES COMPILE_OPTIONS -fmad=false)

  # Kernel-lab probes the benchmark runs beside the production kernels (bench/lab).
  add_library(parity_bench_lab STATIC ${PROJECT_SOURCE_DIR}/bench/lab/row_probe.cu)
  target_link_libraries(parity_bench_lab PUBLIC parity_backend_gpu)
  target_compile_options(parity_bench_lab PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_parity_gencode} -lineinfo
    -Xcompiler=-Wall,-Wextra,-Werror>)
  add_executable(embedding_bench ${PROJECT_SOURCE_DIR}/bench/embedding_bench.cpp)
  target_link_libraries(embedding_bench PRIVATE parity_options parity_bench_lab parity_backend_gpu parity_backend_cpu
                        parity_data parity_perf)
  target_compile_definitions(embedding_bench PRIVATE PARITY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_include_directories(embedding_bench PRIVATE ${PROJECT_SOURCE_DIR}/bench)
  # The HSTU attention kernels alone, full-length and jagged (bench/hstu-attention.sh).
  add_executable(attention_bench ${PROJECT_SOURCE_DIR}/bench/attention_bench.cpp)
  target_link_libraries(attention_bench PRIVATE parity_options parity_backend_gpu parity_spec fmt::fmt)
  # Every kernel configuration of the BLAS library timed over the selection suite (the oracle of
  # kernel selection, bench/gemm-oracle.sh).
  add_executable(gemm_bench ${PROJECT_SOURCE_DIR}/bench/gemm_bench.cpp)
  target_link_libraries(gemm_bench PRIVATE parity_options parity_backend_gpu parity_select parity_perf parity_spec
                        nlohmann_json::nlohmann_json)
  target_compile_definitions(gemm_bench PRIVATE PARITY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  # The dense ops of a step beside the measured roofline and the planner's prediction.
  add_executable(dense_bench ${PROJECT_SOURCE_DIR}/bench/dense_bench.cpp
                 ${PROJECT_SOURCE_DIR}/bench/dense_inputs.cpp ${PROJECT_SOURCE_DIR}/bench/dense_step.cpp
                 ${PROJECT_SOURCE_DIR}/bench/dense_passes.cpp)
  target_link_libraries(dense_bench PRIVATE parity_options parity_backend_gpu parity_backend_cpu parity_spec
                        parity_plan parity_perf parity_select nlohmann_json::nlohmann_json)
  target_compile_definitions(dense_bench PRIVATE PARITY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_include_directories(dense_bench PRIVATE ${PROJECT_SOURCE_DIR}/bench)
  if(PARITY_BUILD_TESTS)
    # The benchmark itself, without a GPU: its arguments, and every op of a step run once on the
    # cpu backend in the storage types each dense math gives (dense_bench --check-on-cpu).
    function(parity_dense_bench_test name exit_code regex)
      add_test(NAME bench.${name}
               COMMAND ${PROJECT_SOURCE_DIR}/tests/cli/expect.sh ${exit_code} ${regex} $<TARGET_FILE:dense_bench>
                       ${ARGN}
               WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
      set_tests_properties(bench.${name} PROPERTIES LABELS bench TIMEOUT 300 ENVIRONMENT OMP_WAIT_POLICY=PASSIVE)
    endfunction()
    parity_dense_bench_test(dense_bench_help 0 "usage: dense_bench" --help)
    parity_dense_bench_test(dense_bench_bad_math 2 "--math: 'fp16' is not bf16, tf32 or fp32" --math fp16)
    parity_dense_bench_test(dense_bench_bad_model 2 "cannot read model spec" --model no/such.yaml)
    parity_dense_bench_test(dense_step_mlperf_bf16 0 "23 ops ran.*0 without a prediction" --check-on-cpu)
    parity_dense_bench_test(dense_step_dot_bf16 0 "13 ops ran.*0 without a prediction" --check-on-cpu
                            --model tiny-dot)
    parity_dense_bench_test(dense_step_tiny_fp32 0 "15 ops ran.*0 without a prediction" --check-on-cpu
                            --model tiny --math fp32)
    # With the forward products checked: every op predicted with the checks, none failing.
    parity_dense_bench_test(dense_step_dot_checked 0 "product checks: [1-9][0-9]* forward products checked, 0 failed"
                            --check-on-cpu --model tiny-dot --product-checks)
  endif()

  if(PARITY_BUILD_TESTS)
    file(GLOB _gpu_test_src CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/gpu/*.cpp)
    add_executable(test_backend_gpu ${_gpu_test_src})
    target_link_libraries(test_backend_gpu PRIVATE parity_options parity_backend_gpu parity_backend_cpu parity_data
                          GTest::gtest GTest::gtest_main)
    gtest_discover_tests(test_backend_gpu DISCOVERY_TIMEOUT 60 PROPERTIES LABELS test_backend_gpu)
  endif()
endif()

# ---- HIP (a real build, when asked for) --------------------------------------------------------
# Without cuda, the engine links it and make_backend("hip") creates it (hipBLASLt is needed for the
# dense path; where its header is absent the backend refuses to start, saying so). With cuda too,
# the engine uses cuda (both compile the same GpuBackend) and this library is built as a check.
if("hip" IN_LIST PARITY_ENABLED_BACKENDS)
  find_program(PARITY_HIPCC hipcc REQUIRED)
  find_package(hip CONFIG REQUIRED)
  set(_hip_objects)
  set(_hip_flags -x hip -std=c++20 -O3 -fPIC -Wall -Wextra -Werror -DPARITY_GPU_HIP=1
      -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src)
  foreach(_arch IN LISTS PARITY_HIP_ARCHS)
    list(APPEND _hip_flags --offload-arch=${_arch})
  endforeach()
  foreach(_src IN LISTS PARITY_GPU_SOURCES)
    get_filename_component(_name ${_src} NAME)
    set(_obj ${CMAKE_CURRENT_BINARY_DIR}/hip/${_name}.o)
    set(_file_flags)
    if(_name STREQUAL "synthetic.cu")  # rounds as on the host (parity/detmath.h)
      set(_file_flags -ffp-contract=off)
    endif()
    add_custom_command(OUTPUT ${_obj}
      COMMAND ${PARITY_HIPCC} ${_hip_flags} ${_file_flags} -c ${_src} -o ${_obj}
      DEPENDS ${_src} ${PARITY_GPU_HEADERS}
      COMMENT "hipcc ${_name} (${PARITY_HIP_ARCHS})" VERBATIM)
    list(APPEND _hip_objects ${_obj})
  endforeach()
  add_library(parity_backend_hip STATIC ${_hip_objects})
  set_target_properties(parity_backend_hip PROPERTIES LINKER_LANGUAGE CXX)
  target_link_libraries(parity_backend_hip PUBLIC $<LINK_ONLY:parity_core> $<LINK_ONLY:parity_select> fmt::fmt hip::host)
  target_include_directories(parity_backend_hip PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(parity_backend_hip PUBLIC PARITY_GPU_HIP=1)
endif()

# ---- CI: every kernel compiles as HIP for AMD ------------------------------------------------
if(PARITY_BUILD_TESTS)
  add_test(NAME gpu.hip_compile
           COMMAND ${PROJECT_SOURCE_DIR}/cmake/hip-compile-check.sh ${CMAKE_CURRENT_BINARY_DIR}/hip-check
                   "${PARITY_HIP_ARCHS}"
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(gpu.hip_compile PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()

# ---- the engine on CUDA: cuBLASLt for the products, make_backend("cuda") ----------------------
if("cuda" IN_LIST PARITY_ENABLED_BACKENDS)
  target_link_libraries(parity_backend_gpu PUBLIC CUDA::cublasLt)
  target_link_libraries(parity_engine PUBLIC parity_backend_gpu)
  target_compile_definitions(parity_engine PRIVATE PARITY_WITH_CUDA_BACKEND=1)
endif()

# ---- make_backend("hip") in a build with hip and without cuda ------------------------------------
if("hip" IN_LIST PARITY_ENABLED_BACKENDS AND NOT "cuda" IN_LIST PARITY_ENABLED_BACKENDS)
  target_link_libraries(parity_engine PUBLIC parity_backend_hip)
  target_compile_definitions(parity_engine PRIVATE PARITY_WITH_HIP_BACKEND=1)
endif()

# ---- engine tests on every backend (tests/engine) ----------------------------------------------
# test_engine runs its engine tests on each backend the build has (cpu, and the GPU backend
# through parity_engine's link above); its GPU-only checks read GpuBackend's counters through
# tests/engine/gpu/counters_gpu.cpp where that backend is built, counters_none.cpp where not.
if(PARITY_BUILD_TESTS AND TARGET test_engine)
  if("cuda" IN_LIST PARITY_ENABLED_BACKENDS OR "hip" IN_LIST PARITY_ENABLED_BACKENDS)
    target_sources(test_engine PRIVATE ${PROJECT_SOURCE_DIR}/tests/engine/gpu/counters_gpu.cpp)
  else()
    target_sources(test_engine PRIVATE ${PROJECT_SOURCE_DIR}/tests/engine/gpu/counters_none.cpp)
  endif()
endif()
