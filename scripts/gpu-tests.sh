#!/usr/bin/env bash
# The GPU tests in one call, on a GPU machine: test_backend_gpu (every GPU op against the CPU
# reference, each launch synchronised so that a failing kernel names itself), then the cuda cases
# of test_engine and test_train (the engine and trainer tests run on every backend built; their
# cpu cases run in ctest everywhere); optionally compute-sanitizer's memcheck on a few short op
# tests. Full logs under $OUT (default out/gpu-tests); a pass/fail table is printed last, and the
# exit status is non-zero when a test failed.
#
#   scripts/gpu-tests.sh                                 # build with cmake here, then run
#   PARITY_PREBUILT=build-prebuilt scripts/gpu-tests.sh  # binaries from scripts/make-prebuilt.sh
#
# Environment: TESTS (default "test_backend_gpu test_engine test_train"), GTEST_FILTER (for
# test_backend_gpu, default all), ENGINE_FILTER (for test_engine and test_train, default
# '*cuda*'), TEST_TIMEOUT (seconds per binary, default 300), MEMCHECK=1 (memcheck on
# MEMCHECK_FILTER, default the DenseGpu* tests below; MEMCHECK_TIMEOUT, default 180).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/../bench/common.sh" gpu-tests
read -ra tests <<<"${TESTS:-test_backend_gpu test_engine test_train}"
memcheck_filter=${MEMCHECK_FILTER:-'DenseGpu.DotInteractionMatchesCpu:DenseGpu.BceWithLogitsMatchesCpu:Dense/DenseGpuCross.BackwardMatchesCpu/bf16:Dense/DenseGpuLinear.BackwardMatchesCpu/fp32:DenseGpuBf16Storage.*'}
find_binaries "${tests[@]}"

rows=()
failed=0
# gtest's summary count of one kind ("PASSED", "FAILED", "SKIPPED") in a log: 0 where the
# summary names none, "-" where the run ended without a summary (a crash or a timeout).
count() {
  local n
  n=$(sed -n "s/^\[  $1 *\] \([0-9][0-9]*\) tests\{0,1\}[,.].*/\1/p" "$2" | tail -1)
  if [ -n "$n" ]; then
    echo "$n"
  elif grep -q '^\[==========\] .* ran' "$2"; then
    echo 0
  else
    echo "-"
  fi
}

for t in "${tests[@]}"; do
  filter=${GTEST_FILTER:-*}
  sync=1
  if [ "$t" != test_backend_gpu ]; then
    filter=${ENGINE_FILTER:-*cuda*}
    sync=0
  fi
  say "$t --gtest_filter='$filter'"
  start=$SECONDS
  PARITY_GPU_SYNC_LAUNCHES=$sync run_bin timeout "${TEST_TIMEOUT:-300}" "$BIN/$t" \
    --gtest_filter="$filter" >"$OUT/$t.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || failed=1
  [ $rc -eq 124 ] && echo "$t: timed out after ${TEST_TIMEOUT:-300} s (TEST_TIMEOUT)" >>"$OUT/$t.log"
  rows+=("$(printf '%-18s %4s %7s %7s %8s %6s' "$t" "$rc" "$(count PASSED "$OUT/$t.log")" \
    "$(count FAILED "$OUT/$t.log")" "$(count SKIPPED "$OUT/$t.log")" "$((SECONDS - start))")")
done

if [ -n "${MEMCHECK:-}" ] && [[ " ${tests[*]} " == *" test_backend_gpu "* ]]; then
  if command -v compute-sanitizer >/dev/null; then
    say "compute-sanitizer memcheck --gtest_filter='$memcheck_filter'"
    start=$SECONDS
    run_bin timeout "${MEMCHECK_TIMEOUT:-180}" compute-sanitizer --tool memcheck --leak-check no \
      --print-limit 20 "$BIN/test_backend_gpu" --gtest_filter="$memcheck_filter" >"$OUT/memcheck.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || failed=1
    summary=$(grep -m1 'ERROR SUMMARY' "$OUT/memcheck.log" || echo "no summary")
    rows+=("$(printf '%-18s %4s %7s %7s %8s %6s  %s' memcheck "$rc" "$(count PASSED "$OUT/memcheck.log")" \
      "$(count FAILED "$OUT/memcheck.log")" "$(count SKIPPED "$OUT/memcheck.log")" "$((SECONDS - start))" \
      "$summary")")
  else
    rows+=("$(printf '%-18s %4s  %s' memcheck - "compute-sanitizer is not installed here")")
  fi
fi
device_after

# ---- summary (last, so that it ends the output) ----
say "measured (the op tests' largest differences from the CPU reference; all in the logs)"
grep -h '\[ measured \]' "$OUT/test_backend_gpu.log" 2>/dev/null | sed 's/^\[ measured \] //' | cut -c1-160 | head -25
say "failures"
for t in "${tests[@]}" memcheck; do
  [ -f "$OUT/$t.log" ] || continue
  grep -h -B1 -A6 'Failure$' "$OUT/$t.log" | head -30
  grep -h '^\[  FAILED  \] [A-Za-z]' "$OUT/$t.log" | sort -u | head -20
  grep -h 'timed out after\|Segmentation\|Aborted\|terminate called' "$OUT/$t.log" | head -5
done
say "GPU tests (logs in $OUT)"
printf '%-18s %4s %7s %7s %8s %6s\n' binary rc passed failed skipped s
printf '%s\n' "${rows[@]}"
exit $failed
