#!/usr/bin/env bash
# The dense GPU path's tests on a GPU machine, in one call: GpuBackend op by op against the CPU
# reference, and the tiny models trained 500 steps on both backends (tests/gpu/test_dense_gpu.cpp).
#
# Usage (from the repository root, on the GPU machine):
#   bench/dense-check.sh [PREBUILT_DIR]
# PREBUILT_DIR (default build-dense-carry) may hold a test_backend_gpu built elsewhere with the
# same CUDA (see "Making PREBUILT_DIR" below) and lib/ with the host libraries it links (fmt,
# yaml-cpp, gomp); it is used when it starts on this machine. Otherwise the script configures and
# builds test_backend_gpu here (needs parity's build dependencies, scripts/setup.sh).
# Writes the full logs under $OUT (or ./out/dense-check) and prints a short summary last.
#
# Making PREBUILT_DIR on a build machine without a GPU:
#   cmake -S . -B build-dense -G Ninja -DPARITY_BACKENDS="cpu;cuda" && cmake --build build-dense --target test_backend_gpu
#   mkdir -p build-dense-carry/lib build-dense-carry/compat && cp build-dense/test_backend_gpu build-dense-carry/
#   cp -L /lib/x86_64-linux-gnu/lib{fmt.so.9,yaml-cpp.so.0.7,gomp.so.1} build-dense-carry/lib/
#   cp -L /lib/x86_64-linux-gnu/libstdc++.so.6 build-dense-carry/compat/
set -uo pipefail
out=${OUT:-out/dense-check}
mkdir -p "$out"
pre=${1:-build-dense-carry}
filter='*Dense*:*GpuEngine*'
start=$(date +%s)

{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader 2>&1 | head -2
  echo "cpus $(nproc); $(grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null); $(ldd --version 2>&1 | head -1)"
} 2>&1 | tee "$out/machine.txt"

# ---- a test binary that starts here ----
bin=""
if [ -x "$pre/test_backend_gpu" ]; then
  libs="$(pwd)/$pre/lib"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(find /usr /opt -name 'libcublasLt.so.13' -printf '%h\n' 2>/dev/null | head -3); do
    [ -e "$d/libcublasLt.so.13" ] && libs="$libs:$d"
  done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if "$pre/test_backend_gpu" --gtest_list_tests > "$out/list.txt" 2>&1; then
    bin="$pre/test_backend_gpu"
  else
    echo "prebuilt binary does not start with the system libstdc++: $(head -c 400 "$out/list.txt")"
    export LD_LIBRARY_PATH="$(pwd)/$pre/compat:$LD_LIBRARY_PATH"
    if "$pre/test_backend_gpu" --gtest_list_tests > "$out/list.txt" 2>&1; then
      bin="$pre/test_backend_gpu"
    else
      echo "prebuilt binary does not start: $(head -c 400 "$out/list.txt")"
    fi
  fi
fi
if [ -z "$bin" ]; then
  echo "== building test_backend_gpu here"
  if cmake -S . -B build-dense-device -G Ninja -DPARITY_BACKENDS="cpu;cuda" > "$out/configure.log" 2>&1 &&
     cmake --build build-dense-device --target test_backend_gpu -j "$(nproc)" > "$out/build.log" 2>&1; then
    bin=build-dense-device/test_backend_gpu
  else
    echo "BUILD FAILED (configure/build logs under $out)"; tail -20 "$out/configure.log" "$out/build.log" 2>/dev/null
    exit 1
  fi
fi
echo "== running $bin --gtest_filter='$filter' (binary ready after $(( $(date +%s) - start )) s)"

# ---- the tests ----
timeout 330 "$bin" --gtest_filter="$filter" --gtest_output="xml:$out/dense-tests.xml" > "$out/dense-tests.log" 2>&1
rc=$?
echo "tests exited with $rc after $(( $(date +%s) - start )) s"

# ---- memory checker on the op tests (short problems), where the tool exists and time is left ----
if command -v compute-sanitizer > /dev/null && [ $(( $(date +%s) - start )) -lt 300 ]; then
  timeout 120 compute-sanitizer --tool memcheck --leak-check no --print-limit 20 "$bin" \
    --gtest_filter='DenseGpu.DotInteraction*:DenseGpu.BceWithLogits*:Dense/DenseGpuCross.BackwardMatchesCpu/bf16:Dense/DenseGpuLinear.BackwardMatchesCpu/fp32' \
    > "$out/memcheck.log" 2>&1
  echo "memcheck exited with $? ($(grep -m1 'ERROR SUMMARY' "$out/memcheck.log" || echo 'no summary'))"
fi

# ---- summary (last, so that it ends the output) ----
echo "== measured: per op and math, the largest |gpu - cpu| / magnitude over its cases"
grep -h 'magnitude =' "$out/dense-tests.log" |
  awk -F': max [|]gpu - cpu[|] / magnitude = ' '{
    key = $1; sub(/^\[ measured \] /, "", key)
    gsub(/ \[[0-9]+x[0-9]+\]x\[[0-9]+\]/, "", key); gsub(/ B[0-9]+ [ND][0-9]+ [rF][0-9]+/, "", key)
    split($2, a, " "); v = a[1] + 0
    if (!(key in m) || v > m[key]) { m[key] = v; t[key] = a[3] }
    n[key]++
  } END { for (k in m) printf "%-42s %9.3g over %2d cases (tolerance %s\n", k, m[k], n[k], t[k] }' | sort
echo "== measured: the rest"
grep -h '\[ measured \]' "$out/dense-tests.log" | grep -v 'magnitude =' | sed 's/^\[ measured \] //' | cut -c1-260
echo "== failures"
grep -h -A6 'Failure' "$out/dense-tests.log" | head -60
grep -h '^\[  FAILED  \]\|^\[  PASSED  \]\|^\[  SKIPPED \] [0-9]' "$out/dense-tests.log" | sort | uniq | head -40
exit $rc
