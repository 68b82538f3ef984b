#!/usr/bin/env bash
# "Does a model larger than the GPU's memory train on one GPU with part of its tables in host
# memory, at the plan's speed and cache hit rate?": run on the GPU machine from the repository
# root.
#
#   PARITY_PREBUILT=build-prebuilt bench/host-tables-check.sh
#
# Steps (full logs under $OUT, or ./out/host-tables-check; a short table is printed last):
#   1. GPU tests of host placement (test_engine's HostTables cases on the GPU) unless SKIP_TESTS=1
#   2. the plan for MODEL on one GPU (default mlperf-dlrmv2-adagrad: 209 GB of tables and
#      per-element Adagrad state, so the planner places its coldest tables in host memory)
#   3. parity train --plan on synthetic data made on the device: STEPS steps with --profile, so
#      the cache refreshes at steps 4, 16, 64 and 256 are in the run and the steady steps after
#      them are profiled (measured step time and categories beside the plan's, the cache hit rate
#      per host-placed table beside the predicted one)
# Environment: MODEL, STEPS (default 400), SKIP_TESTS.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" host-tables-check
MODEL=${MODEL:-mlperf-dlrmv2-adagrad}
STEPS=${STEPS:-400}
device_facts
find_binaries parity test_engine

if [ -z "${SKIP_TESTS:-}" ]; then
  say "test_engine --gtest_filter='*HostTables*cuda*'"
  run_bin timeout 300 "$BIN/test_engine" --gtest_filter='*HostTables*cuda*' >"$OUT/test_engine.log" 2>&1
  echo "test_engine rc $?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_engine.log" | tr '\n' ' ')"
fi

P="$BIN/parity"
say "plan $MODEL"
run_bin "$P" plan --model "$MODEL" --device h200 --gpus 1 --verbose --out "$OUT/plan.json" \
  >"$OUT/plan.txt" 2>&1
grep -E "step|examples/s|memory|host" "$OUT/plan.txt" | head -12

say "train $MODEL: $STEPS steps, --profile"
run_bin /usr/bin/time -v "$P" train --plan "$OUT/plan.json" --steps "$STEPS" --profile \
  >"$OUT/train.txt" 2>&1
echo "train rc $?"
grep -E "examples/s|Maximum resident|Elapsed" "$OUT/train.txt" | head -8
device_after

say "summary"
sed -n '/^step profile/,/^  wall time per step/p' "$OUT/train.txt"
sed -n '/^host-placed tables/,/^$/p' "$OUT/train.txt"
