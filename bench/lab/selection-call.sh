#!/usr/bin/env bash
# One device call for the kernel-selection work (issue 15): the selection GPU tests, parity
# calibrate with its raw runs, gemm_bench over the suite with the catalog, and the MLPerf step's
# products with the catalog's choices against the heuristic's (dense_bench --gemm-catalog), each
# within what is left of one ten-minute command. Expects the prebuilt binaries packed as
# build-pbz/pb.tar.xz (carried). Environment: TYPES (calibrated, default bf16), BENCH_TYPES
# (gemm_bench's, default TYPES), EVERY (default 2), CATALOG (a catalog measured before: skips
# calibrate), LIMIT_S (default 570), AB_S (seconds kept for the A/B, default 110; 0: none),
# TRAIN_MODELS (models `parity train` runs last, auto-planned with the fresh catalog installed as
# the device's, each with the plan's kernel choices and with the library's; default none),
# TRAIN_S (seconds kept for them, default 120), STEPS (their steps, default 40), EVERY=0 skips
# gemm_bench, AB_MODELS (the models of the A/B, default the MLPerf model; AB_S is shared among
# them).
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
train_s=${TRAIN_MODELS:+${TRAIN_S:-120}}
budget=$(($(left) - ${AB_S:-110} - ${train_s:-0}))
if [ "${EVERY:-2}" != 0 ]; then
  say "gemm_bench, budget $budget s"
  run_bin timeout $((budget + 60)) "$BIN/gemm_bench" --types "${BENCH_TYPES:-$types}" \
    --every "${EVERY:-2}" --budget-s $budget --catalog "$catalog" --device h200 \
    --out $W/ks.jsonl >$R/ks.txt 2>&1
  tail -25 $R/ks.txt
  gzip -c $W/ks.jsonl >$R/kernel-selection.jsonl.gz
fi
ab_models=${AB_MODELS:-mlperf-dlrmv2}
n_ab=$(echo $ab_models | wc -w)
for m in $ab_models; do
  [ -f "$catalog" ] && [ "${AB_S:-110}" != 0 ] && [ "$(left)" -gt 60 ] || break
  say "dense_bench A/B $m ($(left) s left)"
  run_bin timeout $(((${AB_S:-110}) / n_ab)) "$BIN/dense_bench" --model $m --no-passes --reps 20 \
    --gemm-catalog "$catalog" --results $R/dense-ab-$m.json >$W/dense-ab-$m.txt 2>&1
  grep -A50 '^kernel choices' $W/dense-ab-$m.txt | grep -E "^kernel|ops with|all dense|^op " 
  grep -E "refuses|none of the plan|takes the library" $W/dense-ab-$m.txt | sort | uniq -c | head -5
done
if [ -n "${TRAIN_MODELS:-}" ] && [ -f "$catalog" ]; then
  [ "$catalog" -ef configs/calibration/h200-gemm.json ] || cp "$catalog" configs/calibration/h200-gemm.json
  for m in $TRAIN_MODELS; do
    for sel in plan heuristic; do
      say "train $m, kernels: $sel ($(left) s left)"
      run_bin timeout $(($(left) - 5)) "$BIN/parity" train --model "$m" --steps "${STEPS:-40}" \
        --gemm-selection $sel >$W/train-$m-$sel.txt 2>&1
      grep -E "kernels|kernel selection|examples/s|refuses|none of the plan" \
        $W/train-$m-$sel.txt | tail -8
    done
  done
fi
tar czf $R/logs.tgz -C $W --exclude='*.jsonl' .
say "done"
