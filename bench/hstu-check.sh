#!/usr/bin/env bash
# HSTU on the GPU, in one call: the sequence ops against the CPU reference (test_backend_gpu
# SequenceGpu.*), the engine's steps on cuda against the cpu (test_engine *Hstu*), then
# `parity train` of hstu-tiny on cuda (fp32 and bf16 dense math) and on the cpu, and a few
# profiled steps of hstu-feed-1k on cuda in fp32 and bf16.
# Full logs under $OUT (default out/hstu-check); a table last.
#
#   PARITY_PREBUILT=build-prebuilt bench/hstu-check.sh
#
# Environment: TINY_STEPS (default 300), FEED_STEPS (default 16), FEED_BATCH (default 256),
# SKIP_TESTS=1.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" hstu-check
rows=()
if [[ "${SKIP_TESTS:-0}" == 1 ]]; then
  find_binaries parity
else
  find_binaries parity test_backend_gpu test_engine
  say "test_backend_gpu SequenceGpu.*"
  PARITY_GPU_SYNC_LAUNCHES=1 run_bin timeout 300 "$BIN/test_backend_gpu" --gtest_filter='SequenceGpu.*' \
    >"$OUT/sequence_gpu.log" 2>&1
  rows+=("$(printf '%-34s rc %s' "SequenceGpu.*" "$?")")
  say "test_engine *Hstu*cuda*"
  run_bin timeout 300 "$BIN/test_engine" --gtest_filter='*HstuOnEveryBackend*' >"$OUT/engine.log" 2>&1
  rows+=("$(printf '%-34s rc %s' "HstuOnEveryBackend" "$?")")
fi
for run in "cuda fp32" "cuda bf16" "cpu fp32"; do
  read -r backend math <<<"$run"
  say "parity train hstu-tiny --backend $backend --dense-math $math"
  start=$SECONDS
  run_bin timeout 300 "$BIN/parity" train --model hstu-tiny --backend "$backend" --dense-math "$math" \
    --steps "${TINY_STEPS:-300}" --eval-examples 4096 >"$OUT/tiny-$backend-$math.log" 2>&1
  rc=$?
  rows+=("$(printf '%-34s rc %s  %s s  %s' "train hstu-tiny $backend $math" "$rc" "$((SECONDS - start))" \
    "$(grep -o 'done .*' "$OUT/tiny-$backend-$math.log" | tail -1)")")
done
for math in fp32 bf16; do
  say "parity train hstu-feed-1k --backend cuda --dense-math $math --profile"
  start=$SECONDS
  run_bin timeout 400 "$BIN/parity" train --model hstu-feed-1k --backend cuda --dense-math "$math" \
    --steps "${FEED_STEPS:-16}" --batch "${FEED_BATCH:-256}" --eval-examples 256 --profile \
    >"$OUT/feed-$math.log" 2>&1
  rc=$?
  rows+=("$(printf '%-34s rc %s  %s s  %s' "train hstu-feed-1k cuda $math" "$rc" "$((SECONDS - start))" \
    "$(grep -o 'done .*' "$OUT/feed-$math.log" | tail -1)")")
done
grep -h "measured\|FAILED\|Failure" "$OUT"/sequence_gpu.log "$OUT"/engine.log 2>/dev/null | head -40
grep -h "attention\|sum of categories\|wall time" "$OUT"/feed-*.log | head -20
printf '%s\n' "${rows[@]}"
