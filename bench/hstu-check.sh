#!/usr/bin/env bash
# HSTU on the GPU, in one call: the sequence ops against the CPU reference (test_backend_gpu
# SequenceGpu.*), the engine's steps on cuda against the cpu (test_engine *Hstu*), then
# `parity train` of hstu-tiny on cuda and on the cpu, and a few steps of hstu-feed-1k on cuda.
# Full logs under $OUT (default out/hstu-check); a table last.
#
#   PARITY_PREBUILT=build-prebuilt bench/hstu-check.sh
#
# Environment: TINY_STEPS (default 300), FEED_STEPS (default 6), FEED_BATCH (default 64).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" hstu-check
find_binaries parity test_backend_gpu test_engine
rows=()
say "test_backend_gpu SequenceGpu.*"
PARITY_GPU_SYNC_LAUNCHES=1 run_bin timeout 300 "$BIN/test_backend_gpu" --gtest_filter='SequenceGpu.*' \
  >"$OUT/sequence_gpu.log" 2>&1
rows+=("$(printf '%-34s rc %s' "SequenceGpu.*" "$?")")
say "test_engine *Hstu*cuda*"
run_bin timeout 300 "$BIN/test_engine" --gtest_filter='*HstuOnEveryBackend*' >"$OUT/engine.log" 2>&1
rows+=("$(printf '%-34s rc %s' "HstuOnEveryBackend" "$?")")
for backend in cuda cpu; do
  say "parity train hstu-tiny --backend $backend"
  start=$SECONDS
  run_bin timeout 300 "$BIN/parity" train --model hstu-tiny --backend "$backend" \
    --steps "${TINY_STEPS:-300}" --eval-examples 4096 >"$OUT/tiny-$backend.log" 2>&1
  rc=$?
  rows+=("$(printf '%-34s rc %s  %s s  %s' "train hstu-tiny $backend" "$rc" "$((SECONDS - start))" \
    "$(grep -o 'done .*' "$OUT/tiny-$backend.log" | tail -1)")")
done
say "parity train hstu-feed-1k --backend cuda"
start=$SECONDS
run_bin timeout 400 "$BIN/parity" train --model hstu-feed-1k --backend cuda \
  --steps "${FEED_STEPS:-6}" --batch "${FEED_BATCH:-64}" --eval-examples 64 >"$OUT/feed.log" 2>&1
rc=$?
rows+=("$(printf '%-34s rc %s  %s s  %s' "train hstu-feed-1k cuda" "$rc" "$((SECONDS - start))" \
  "$(grep -o 'done .*' "$OUT/feed.log" | tail -1)")")
grep -h "measured\|FAILED\|Failure" "$OUT/sequence_gpu.log" "$OUT/engine.log" | head -40
printf '%s\n' "${rows[@]}"
