#!/usr/bin/env bash
# One device call for the kernel-selection work (issue 15): the selection GPU tests, parity
# calibrate with its raw runs, gemm_bench over the suite with the catalog, and the MLPerf step's
# products with the catalog's choices against the heuristic's (dense_bench --gemm-catalog), each
# within what is left of one ten-minute command. Expects the prebuilt binaries packed as
# build-pbz/pb.tar.xz (carried). Environment: TYPES (calibrated, default bf16), BENCH_TYPES
# (gemm_bench's, default TYPES), EVERY (default 2), CATALOG (a catalog measured before: skips
# calibrate), LIMIT_S (default 570), AB_S (seconds kept for the A/B, default 110; 0: none).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PARITY_PREBUILT=build-pb
tar xJf build-pbz/pb.tar.xz
R=$OUT W=$(mktemp -d)  # scratch; what comes back is written under $OUT
mkdir -p $W
limit=${LIMIT_S:-570} types=${TYPES:-bf16}
left() { echo $((limit - SECONDS)); }
if [ -z "${SKIP_TESTS:-}" ]; then
  OUT=$W/gt TESTS=test_backend_gpu GTEST_FILTER='KernelSelectionGpu.*:*Blas*:*Linear*' \
    TEST_TIMEOUT=120 scripts/gpu-tests.sh >$W/gpu-tests.txt 2>&1
  tail -6 $W/gpu-tests.txt
fi
. bench/common.sh selection
find_binaries parity gemm_bench dense_bench >/dev/null
catalog=${CATALOG:-$W/h200-gemm.json}
if [ -z "${CATALOG:-}" ]; then
  say "calibrate $types ($(left) s left)"
  run_bin timeout $(($(left) - 200)) "$BIN/parity" calibrate --device h200 --types "$types" \
    --out "$catalog" --samples $W/calibration-runs.jsonl >$R/calibrate.txt 2>&1
  tail -30 $R/calibrate.txt
  gzip -c $W/calibration-runs.jsonl >$R/calibration-runs.jsonl.gz 2>/dev/null
  cp "$catalog" $R/ 2>/dev/null
fi
budget=$(($(left) - ${AB_S:-110}))
say "gemm_bench, budget $budget s"
run_bin timeout $((budget + 60)) "$BIN/gemm_bench" --types "${BENCH_TYPES:-$types}" --every "${EVERY:-2}" \
  --budget-s $budget --catalog "$catalog" --device h200 --out $W/ks.jsonl >$R/ks.txt 2>&1
tail -25 $R/ks.txt
gzip -c $W/ks.jsonl >$R/kernel-selection.jsonl.gz
if [ -f "$catalog" ] && [ "${AB_S:-110}" != 0 ] && [ "$(left)" -gt 60 ]; then
  say "dense_bench A/B ($(left) s left)"
  run_bin timeout $(($(left) - 10)) "$BIN/dense_bench" --no-passes --reps 20 \
    --gemm-catalog "$catalog" --results $R/dense-ab.json >$W/dense-ab.txt 2>&1
  grep -A40 '^kernel choices' $W/dense-ab.txt | head -40
fi
tar czf $R/logs.tgz -C $W --exclude='*.jsonl' .
say "done"
