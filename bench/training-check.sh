#!/usr/bin/env bash
# THE one script for "how fast does parity train the MLPerf DLRMv2 model on this GPU, and how does
# PyTorch compare in the same run": run on the GPU machine from the repository root.
#
#   bench/training-check.sh                                 # everything (about 6-8 minutes on one H200)
#   PARITY_PREBUILT=build-prebuilt bench/training-check.sh  # binaries from scripts/make-prebuilt.sh
#
# Steps (full logs under $OUT, or ./out/training-check; a short table is printed last):
#   1. GPU tests (scripts/gpu-tests.sh: test_backend_gpu, and the engine and trainer tests on the
#      GPU in test_engine and test_train) unless SKIP_TESTS=1
#   2. the plan for the full model on one GPU (parity plan --out plan.json)
#   3. a shard dataset of the full model's synthetic data (parity data synth), TRAIN_BATCHES
#      batches of 65,536 plus 4 held-out batches, in $SHARDS (page cache holds it)
#   4. parity train --plan on the full model: STEPS steps (throughput), then PROFILE_STEPS steps
#      with --profile (step time by op category beside the plan's prediction)
#   5. the same on mlperf-dlrmv2-2m (tables capped at 2M rows), for the peer comparison
#   6. PyTorch (bench/dlrm_torch.py): the capped model eager and with torch.compile; the full
#      model with a hand-written rowwise Adagrad where it fits (unless SKIP_TORCH=1)
# Environment: STEPS (default 300), PROFILE_STEPS (60), TRAIN_BATCHES (96), SKIP_TESTS, SKIP_TORCH,
# SKIP_FULL_TORCH, TORCH_STEPS (40), TESTS and TEST_TIMEOUT (for scripts/gpu-tests.sh; 200 s a binary),
# SHARDS (the dataset folder, default in the scratch folder), SCRATCH (bench/common.sh).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" training-check
STEPS=${STEPS:-300}
PROFILE_STEPS=${PROFILE_STEPS:-60}
TRAIN_BATCHES=${TRAIN_BATCHES:-96}
TORCH_STEPS=${TORCH_STEPS:-40}
SHARDS=${SHARDS:-$SCRATCH/shards}
TEST_TIMEOUT=${TEST_TIMEOUT:-200}
device_facts

# ---- binaries, 1. tests ----
binaries_and_tests parity

# ---- 2-4. the full model ----
P="$BIN/parity"
say "plan"
run_bin "$P" plan --model mlperf-dlrmv2 --device h200 --gpus 1 --out "$OUT/plan.json" >"$OUT/plan.txt" 2>&1
head -5 "$OUT/plan.txt"
run_bin "$P" plan --model mlperf-dlrmv2-2m --device h200 --gpus 1 --out "$OUT/plan-2m.json" >"$OUT/plan-2m.txt" 2>&1

rm -rf "$SHARDS"
say "shards: $TRAIN_BATCHES batches of the full model"
run_bin /usr/bin/time -v "$P" data synth --model mlperf-dlrmv2 --examples $((TRAIN_BATCHES * 65536)) --eval-examples 262144 \
  --out "$SHARDS/full" >"$OUT/synth.log" 2>&1
grep -E "parity data|Elapsed|Maximum resident" "$OUT/synth.log"
du -sh "$SHARDS/full" 2>/dev/null

run_train() {  # name, args...
  local name=$1
  shift
  say "train: $name"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader -lms 500 >"$OUT/$name.smi" 2>&1 &
  local smi=$!
  run_bin /usr/bin/time -v "$P" train "$@" >"$OUT/$name.log" 2>&1
  echo "rc=$?" >>"$OUT/$name.log"
  kill "$smi" 2>/dev/null
  grep -E "^parity train: model|^eval|^done|^rc=|error|failed" "$OUT/$name.log" | head -8
  awk -F', ' '{gsub(/ %| MiB/,""); if ($1+0 > u) u = $1+0; if ($2+0 > m) m = $2+0} END {print "  peak GPU util " u "%, peak memory " m " MiB"}' "$OUT/$name.smi"
}
run_train full --plan "$OUT/plan.json" --data "$SHARDS/full" --steps "$STEPS" --eval-examples 262144 --eval-every 0
run_train full-profile --plan "$OUT/plan.json" --data "$SHARDS/full" --steps "$PROFILE_STEPS" --eval-examples 65536 \
  --eval-every 0 --profile
sed -n '/step profile/,/wall time/p' "$OUT/full-profile.log"
# Synthetic batches made on the device: as many steps as the shard run, to compare like with like.
run_train full-onthefly --plan "$OUT/plan.json" --steps "$STEPS" --eval-examples 65536 --eval-every 0

# ---- 5. the capped model ----
rm -rf "$SHARDS/full"
say "shards: 32 batches of the capped model"
run_bin "$P" data synth --model mlperf-dlrmv2-2m --examples $((32 * 65536)) --eval-examples 65536 --out "$SHARDS/capped" \
  >"$OUT/synth-2m.log" 2>&1
run_train capped --plan "$OUT/plan-2m.json" --data "$SHARDS/capped" --steps "$STEPS" --eval-examples 65536 --eval-every 0

# ---- 6. PyTorch ----
torch_run() {  # name, args...
  local name=$1
  shift
  say "torch: $name"
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-240}" python3 bench/dlrm_torch.py --steps "$TORCH_STEPS" "$@" \
    >"$OUT/torch-$name.log" 2>&1
  echo "rc=$?" >>"$OUT/torch-$name.log"
  grep -E "RESULT|did not fit|Error|rc=" "$OUT/torch-$name.log" | tail -3
}
if [ -z "${SKIP_TORCH:-}" ]; then
  torch_run capped-eager --model configs/models/mlperf-dlrmv2-2m.yaml --dense-math bf16
  torch_run capped-compile --model configs/models/mlperf-dlrmv2-2m.yaml --dense-math bf16 --compile
  if [ -z "${SKIP_FULL_TORCH:-}" ]; then
    torch_run full-compile --model configs/models/mlperf-dlrmv2.yaml --dense-math bf16 --compile
  fi
fi

# ---- summary ----
say "summary"
ex() { grep -E "^done" "$OUT/$1.log" 2>/dev/null | sed -E 's/^done +[0-9]+ steps +//; s/ examples\/s//; s/  final.*//'; }
tex() { grep -E "^RESULT" "$OUT/torch-$1.log" 2>/dev/null | sed -E 's/.*"examples_per_s": ([0-9.]+).*/\1/' |
  awk '{printf "%.2fM", $1 / 1e6}'; }
printf "%-46s %s\n" "run" "examples/s"
printf "%-46s %s\n" "parity, full model, shards" "$(ex full)"
printf "%-46s %s\n" "parity, full model, synthetic made on the device" "$(ex full-onthefly)"
printf "%-46s %s\n" "parity, tables capped at 2M, shards" "$(ex capped)"
printf "%-46s %s\n" "PyTorch eager, capped" "$(tex capped-eager)"
printf "%-46s %s\n" "PyTorch torch.compile, capped" "$(tex capped-compile)"
printf "%-46s %s\n" "PyTorch torch.compile, full (rowwise Adagrad)" "$(tex full-compile)"
printf "%-46s %s\n" "planner prediction, full" "$(grep -m1 predicted "$OUT/plan.txt" | sed 's/^ *//')"
rm -rf "$SHARDS"
say "done"
