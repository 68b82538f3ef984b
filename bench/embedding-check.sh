#!/usr/bin/env bash
# THE one script for "how close to the speed of memory do parity's embedding kernels run on this
# GPU, and how does PyTorch's nn.EmbeddingBag compare on the same inputs": run on the GPU machine
# from the repository root. Finds or builds the binaries, runs the GPU op tests, the embedding
# benchmark (beside the measured copy bandwidth) and PyTorch's nn.EmbeddingBag on the same ids,
# and prints a short table last. Full logs go to $OUT (default out/embedding-check).
#
#   bench/embedding-check.sh                                 # build with cmake here, then run
#   PARITY_PREBUILT=build-prebuilt bench/embedding-check.sh  # binaries from scripts/make-prebuilt.sh
#
# Environment: BENCH_CASES (default single,variants,mlperf; empty for none), BENCH_MODELS (zoo
# models whose tables to time, whole and by shape), GTEST_FILTER (default all),
# SKIP_TESTS=1, SKIP_BENCH=1, SKIP_TORCH=1, BENCH_REPS (default 20), BENCH_ARGS (more
# embedding_bench flags), TESTS (default test_backend_gpu), TEST_TIMEOUT (150), BENCH_TIMEOUT
# (240), TORCH_TIMEOUT (160), PROBE_BUILD=1 (also try a cmake configure here).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" embedding-check
TESTS=${TESTS:-test_backend_gpu}
TEST_TIMEOUT=${TEST_TIMEOUT:-150}
read -ra bench_args <<<"${BENCH_ARGS:-}"
device_facts

# ---- binaries, tests ------------------------------------------------------------------------
binaries_and_tests embedding_bench

# ---- benchmarks -----------------------------------------------------------------------------
DUMP=$SCRATCH/embedding-inputs
if [ -z "${SKIP_BENCH:-}" ] && [ -n "${BENCH_CASES-x}" ]; then
  say "embedding_bench"
  rm -rf "$DUMP"
  run_bin timeout "${BENCH_TIMEOUT:-240}" "$BIN/embedding_bench" --model configs/models/mlperf-dlrmv2.yaml \
    --cases "${BENCH_CASES-single,variants,mlperf}" --reps "${BENCH_REPS:-20}" \
    --dump "$DUMP" --results "$OUT/parity.json" "${bench_args[@]}" 2>&1 | tee "$OUT/bench.log"
  say "bench rc=${PIPESTATUS[0]}"
fi
# Any zoo model's tables, whole and one shape at a time (embedding_bench --cases model).
for m in ${BENCH_MODELS:-}; do
  say "embedding_bench, the tables of $m"
  run_bin timeout "${BENCH_TIMEOUT:-240}" "$BIN/embedding_bench" --model "configs/models/$m.yaml" \
    --cases model --reps "${BENCH_REPS:-20}" "${bench_args[@]}" 2>&1 | tee "$OUT/bench-$m.log"
  say "bench $m rc=${PIPESTATUS[0]}"
done
if [ -z "${SKIP_TORCH:-}" ] && [ -f "$OUT/parity.json" ]; then
  say "PyTorch nn.EmbeddingBag on the same inputs"
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-160}" python3 bench/embedding_torch.py --dump "$DUMP" \
    --parity "$OUT/parity.json" --out "$OUT/torch.json" --reps "${BENCH_REPS:-20}" 2>&1 | tee "$OUT/torch.log"
  say "torch rc=${PIPESTATUS[0]}"
fi
device_after
if [ -n "${PROBE_BUILD:-}" ]; then  # can this machine configure the project? (configure only)
  say "probe: cmake configure on this machine"
  timeout 60 cmake -S . -B "$SCRATCH/probe" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPARITY_BACKENDS=cpu;cuda" \
    >>"$OUT/build.log" 2>&1
  say "probe configure rc=$?"
  tail -5 "$OUT/build.log"
fi
say "done"
