#!/usr/bin/env bash
# THE one script per GPU-machine call: build (or use prebuilt binaries), run the GPU tests, run the
# embedding benchmark, run PyTorch's nn.EmbeddingBag on the same inputs, and print a short table
# last. Full logs go to $OUT (or ./out).
#
#   bench/gpu-check.sh                         # build with cmake on this machine, then run
#   PARITY_PREBUILT=.devbin bench/gpu-check.sh # use binaries built elsewhere (+ .devbin/lib)
#
# Environment: BENCH_CASES (default single,variants,mlperf), GTEST_FILTER (default all),
# SKIP_TESTS=1, SKIP_BENCH=1, SKIP_TORCH=1, BENCH_REPS (default 20), BENCH_ARGS (more embedding_bench flags).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
say() { echo "== $(date +%H:%M:%S) $*"; }

say "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$OUT/device.txt"

# ---- binaries -------------------------------------------------------------------------------
BIN=""
# cuBLASLt (the dense path) from the CUDA toolkit, or else from PyTorch's wheel.
CUBLAS_DIR=$(python3 -c 'import nvidia.cublas, os; print(list(nvidia.cublas.__path__)[0] + "/lib")' 2>/dev/null || true)
run_bin() { LD_LIBRARY_PATH="${PARITY_LIB_PATH:-}:/usr/local/cuda/lib64:${CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
if [ -n "${PARITY_PREBUILT:-}" ]; then
  PARITY_LIB_PATH="$PWD/$PARITY_PREBUILT/lib"
  if run_bin "$PARITY_PREBUILT/test_backend_gpu" --gtest_list_tests >/dev/null 2>"$OUT/build.log"; then
    BIN=$PARITY_PREBUILT
    say "using prebuilt binaries in $BIN"
  else
    say "prebuilt binaries do not run here (see build.log); building"
    PARITY_LIB_PATH=""
  fi
fi
if [ -z "$BIN" ]; then
  say "build (cmake, Release, cpu;cuda)"
  start=$(date +%s)
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPARITY_BACKENDS=cpu;cuda" &&
    cmake --build build-gpu --target test_backend_gpu embedding_bench; } >>"$OUT/build.log" 2>&1
  rc=$?
  say "build rc=$rc in $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ]; then tail -30 "$OUT/build.log"; exit 1; fi
  BIN=build-gpu
fi

# ---- tests ----------------------------------------------------------------------------------
if [ -z "${SKIP_TESTS:-}" ]; then
  say "test_backend_gpu"
  start=$(date +%s)
  PARITY_GPU_SYNC_LAUNCHES=1 run_bin timeout "${TEST_TIMEOUT:-150}" "$BIN/test_backend_gpu" --gtest_filter="${GTEST_FILTER:-*}" >"$OUT/tests.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |^device:|Failure|expected|FAILED TEST" "$OUT/tests.log" | head -40
  say "tests rc=$rc in $(( $(date +%s) - start )) s"
fi

# ---- benchmarks -----------------------------------------------------------------------------
DUMP=/tmp/parity-embedding-inputs
if [ -z "${SKIP_BENCH:-}" ]; then
  say "embedding_bench"
  rm -rf "$DUMP"
  run_bin timeout "${BENCH_TIMEOUT:-240}" "$BIN/embedding_bench" --cases "${BENCH_CASES:-single,variants,mlperf}" --reps "${BENCH_REPS:-20}" \
    --dump "$DUMP" --results "$OUT/parity.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  say "bench rc=${PIPESTATUS[0]}"
fi
if [ -z "${SKIP_TORCH:-}" ] && [ -f "$OUT/parity.json" ]; then
  say "PyTorch nn.EmbeddingBag on the same inputs"
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-160}" python3 bench/embedding_torch.py --dump "$DUMP" --parity "$OUT/parity.json" \
    --out "$OUT/torch.json" --reps "${BENCH_REPS:-20}" 2>&1 | tee "$OUT/torch.log"
  say "torch rc=${PIPESTATUS[0]}"
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >>"$OUT/device.txt" 2>&1
if [ -n "${PROBE_BUILD:-}" ]; then  # can this machine configure the project? (configure only)
  say "probe: cmake configure on this machine"
  timeout 60 cmake -S . -B /tmp/parity-probe -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPARITY_BACKENDS=cpu;cuda" \
    >>"$OUT/build.log" 2>&1
  say "probe configure rc=$?"; tail -5 "$OUT/build.log"
fi
say "done"
