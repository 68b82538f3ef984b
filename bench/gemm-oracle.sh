#!/usr/bin/env bash
# THE one script for "which of the BLAS library's kernels is fastest for each product, and how
# far is the library's heuristic from it": run on the GPU machine from the repository root.
#
#   PARITY_PREBUILT=build-prebuilt bench/gemm-oracle.sh
#   TYPES=bf16 EVERY=1 bench/gemm-oracle.sh
#
# bench/gemm_bench.cpp over the selection suite (src/select/suite.h: the zoo's products in
# forward, data-gradient and weight-gradient form at several batches, and random shapes): per
# problem the library's configurations enumerated, the heuristic's answers and a seeded sample of
# the rest timed. Writes $OUT/gemm-oracle.jsonl.gz (one JSON object per problem) and the summary
# (gemm-oracle.txt); default OUT out/gemm-oracle. Environment: TYPES (default
# bf16,fp16,tf32,fp32,fp8), EVERY (time every n-th problem, default 1), LIMIT (problems per type,
# 0: all), SAMPLE (default 64), HEURISTIC (default 32), BUDGET_S (default 540).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" gemm-oracle
device_facts
find_binaries gemm_bench
say "gemm_bench"
run_bin "$BIN/gemm_bench" --types "${TYPES:-bf16,fp16,tf32,fp32,fp8}" --every "${EVERY:-1}" \
  --limit "${LIMIT:-0}" --sample "${SAMPLE:-64}" --heuristic "${HEURISTIC:-32}" \
  --budget-s "${BUDGET_S:-540}" --out "$SCRATCH/gemm-oracle.jsonl" 2>&1 | tee "$OUT/gemm-oracle.txt"
gzip -c "$SCRATCH/gemm-oracle.jsonl" >"$OUT/gemm-oracle.jsonl.gz"
device_after
say "done: $(zcat "$OUT/gemm-oracle.jsonl.gz" | wc -l) problems in $OUT/gemm-oracle.jsonl.gz"
