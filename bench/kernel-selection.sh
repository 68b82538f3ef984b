#!/usr/bin/env bash
# THE one script for "does the analytical model pick the BLAS library's fastest kernels, without
# timing anything at selection?": run on the GPU machine from the repository root.
#
#   PARITY_PREBUILT=build-prebuilt bench/kernel-selection.sh
#   TYPES=bf16 EVERY=2 bench/kernel-selection.sh
#
# 1. `parity calibrate` measures the kernel catalog on this GPU (every configuration's fixed,
#    per-tile and per-k-step cost, src/backend/gpu/gemm_calibration.h) into $OUT/h200-gemm.json;
#    CATALOG=FILE uses a catalog measured before instead.
# 2. bench/gemm_bench.cpp over the selection suite with that catalog: per problem the heuristic's
#    answers, a seeded sample of the other configurations and the model's first three picks are
#    timed (the oracle is the best of them); the model's pick against it, its predicted time
#    against the measured, the rank correlation and the selection time are printed per type.
# Writes $OUT/kernel-selection.txt (the summary) and $OUT/kernel-selection.jsonl.gz (every
# problem). Environment: TYPES (default bf16,fp16,tf32,fp32,fp8), EVERY (default 1), LIMIT,
# SAMPLE (default 64), BUDGET_S (gemm_bench's, default 400), CATALOG.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" kernel-selection
device_facts
find_binaries parity gemm_bench
types=${TYPES:-bf16,fp16,tf32,fp32,fp8}
catalog=${CATALOG:-}
if [ -z "$catalog" ]; then
  catalog=$OUT/h200-gemm.json
  say "parity calibrate ($types)"
  run_bin "$BIN/parity" calibrate --device h200 --types "$types" --out "$catalog" 2>&1 |
    tee "$OUT/calibrate.txt"
fi
say "gemm_bench --catalog $catalog"
run_bin "$BIN/gemm_bench" --types "$types" --every "${EVERY:-1}" --limit "${LIMIT:-0}" \
  --sample "${SAMPLE:-64}" --budget-s "${BUDGET_S:-400}" --catalog "$catalog" --device h200 \
  --out "$SCRATCH/kernel-selection.jsonl" 2>&1 | tee "$OUT/kernel-selection.txt"
gzip -c "$SCRATCH/kernel-selection.jsonl" >"$OUT/kernel-selection.jsonl.gz"
device_after
say "done: $(zcat "$OUT/kernel-selection.jsonl.gz" | wc -l) problems"
