#!/usr/bin/env bash
# THE one script for "how fast are parity's dense ops on this GPU (the MLPs' products, the cross
# layers or the dot interaction, the loss, the elementwise passes), against the roofline measured
# in the same run, the planner's prediction and PyTorch on the same shapes": run on the GPU
# machine from the repository root.
#
#   bench/dense-ops.sh                                   # build with cmake here, then run
#   PARITY_PREBUILT=build-prebuilt bench/dense-ops.sh    # binaries from scripts/make-prebuilt.sh
#
# Steps (logs under $OUT, default out/dense-ops; a short table is printed last):
#   1. the GPU tests (scripts/gpu-tests.sh) unless SKIP_TESTS=1
#   2. for each dense math in MATHS, dense_bench: the copy and product ceilings, every dense op of
#      a training step beside its roofline and the planner's prediction, each elementwise pass
#      alone (results in dense-MATH.json, its output in dense-MATH.log)
#   3. the PyTorch peer (bench/dense_torch.py) on the same shapes, storage types and math, its
#      table beside parity's (torch-MATH.json; output appended to dense-MATH.log), unless SKIP_TORCH=1
#   4. one line per math: the step's dense ops in all, measured, roofline, predicted, PyTorch
# Environment: MODEL (default configs/models/mlperf-dlrmv2.yaml), BATCH (default the model's
# batch_size), MATHS (default bf16; any of bf16 tf32 fp32), DEVICE (the predictions' device,
# default h200), BENCH_REPS (default 30), BENCH_ARGS (more dense_bench flags: --gemm-catalog FILE
# also times the step with the kernel catalog's choices against the heuristic's), SKIP_TESTS,
# SKIP_TORCH, BENCH_TIMEOUT (default 240 s per math), TORCH_TIMEOUT (default 240 s per math),
# TESTS and TEST_TIMEOUT (for scripts/gpu-tests.sh).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" dense-ops
MODEL=${MODEL:-configs/models/mlperf-dlrmv2.yaml}
read -ra maths <<<"${MATHS:-bf16}"
read -ra bench_args <<<"${BENCH_ARGS:-}"
[ -z "${BATCH:-}" ] || bench_args=(--batch "$BATCH" "${bench_args[@]}")
device_facts
binaries_and_tests dense_bench

summary=()
for math in "${maths[@]}"; do
  shapes=$SCRATCH/dense-shapes-$math.json
  log=$OUT/dense-$math.log
  rm -f "$shapes"  # written only by a run that measured every op
  say "dense_bench --math $math ($MODEL)"
  run_bin timeout "${BENCH_TIMEOUT:-240}" "$BIN/dense_bench" --model "$MODEL" --math "$math" \
    --device "${DEVICE:-h200}" --reps "${BENCH_REPS:-30}" --results "$OUT/dense-$math.json" \
    --dump "$shapes" "${bench_args[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  say "dense_bench rc=$rc"
  if [ "$rc" -eq 77 ]; then
    say "no GPU here: nothing measured"
    exit 77
  fi
  item=$OUT/dense-$math.json
  if [ -z "${SKIP_TORCH:-}" ] && [ -f "$shapes" ]; then
    say "PyTorch on the same shapes ($math)"
    PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-240}" python3 bench/dense_torch.py --dump "$shapes" \
      --parity "$OUT/dense-$math.json" --out "$OUT/torch-$math.json" 2>&1 | tee -a "$log"
    say "torch rc=${PIPESTATUS[0]}"
    item=$item:$OUT/torch-$math.json
  fi
  summary+=("$item")
done
device_after

# ---- summary (last, so that it ends the output) ----
say "the step's dense ops in all (ms: measured by parity, its roofline, the planner's prediction, PyTorch)"
python3 bench/dense_torch.py --summary "${summary[@]}"
