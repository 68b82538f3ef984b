#!/usr/bin/env bash
# THE one script for "does every model of the zoo train at the speed and memory its plan predicts
# on this GPU": run on the GPU machine from the repository root.
#
#   PARITY_PREBUILT=build-prebuilt bench/zoo-check.sh      # binaries from scripts/make-prebuilt.sh
#   MODELS="tiny criteo-kaggle-dot" bench/zoo-check.sh     # some models only
#   MODEL_DIR=DIR bench/zoo-check.sh                        # every DIR/*.yaml instead of the zoo
#   NOVEL_SEED=7 bench/zoo-check.sh                         # 12 models not in the zoo (novel_models.py)
#
# Per model of configs/models (or MODELS): the plan for one GPU of DEVICE (default h200). Where no
# plan fits one GPU (the planner asks for more) or the plan's host-placed tables need more than
# HOST_SHARE (default 0.6) of this machine's available host memory, every table's rows are capped,
# at 8M and then halved until a plan fits, every other shape kept (the table says which cap); a
# plan with tables in host memory within that share runs as planned. Then parity train
# --plan for STEPS steps on synthetic batches (made on the device), with --profile: the device time
# of the steps (timing marks) beside the plan's and as a multiple of the plan's floor (every op at
# its roofline, `parity plan`'s "floor"), per category, the wall time and examples/s, and the
# peak GPU memory (nvidia-smi every 50 ms, less what was in use before) beside the plan's
# predicted peak. A plan the engine refuses is reported with the plan check's reason. The span of
# making each batch on the device (a copy queue, beside the step before; the plan does not count
# it) has a column of its own: it slows whichever sections it overlaps.
# The table is printed last and written to $OUT/zoo.md (default out/zoo-check); the plans, the
# training logs and the memory samples go into $OUT/zoo-logs.tgz. Environment: MODELS, MODEL_DIR,
# NOVEL_SEED, NOVEL_COUNT (12), DEVICE, STEPS (default 40), TIMEOUT (seconds a model, 240).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" zoo-check
DEVICE=${DEVICE:-h200}
STEPS=${STEPS:-40}
TIMEOUT=${TIMEOUT:-240}
device_facts
find_binaries parity
TABLE=$OUT
OUT=$SCRATCH/logs  # the per-model files, packed at the end
mkdir -p "$OUT"
P="$BIN/parity"
# Every model of the zoo, DLRM and HSTU; or of MODEL_DIR; or NOVEL_COUNT (12) drawn with NOVEL_SEED.
if [ -n "${NOVEL_SEED:-}" ]; then
  MODEL_DIR=$SCRATCH/novel
  python3 "$(dirname "$0")/novel_models.py" --seed "$NOVEL_SEED" --count "${NOVEL_COUNT:-12}" \
    --out "$MODEL_DIR" >/dev/null || { echo "zoo-check: novel_models.py failed" >&2; exit 1; }
fi
MODEL_DIR=${MODEL_DIR:-configs/models}
models=${MODELS:-$(ls "$MODEL_DIR"/*.yaml | xargs -n1 basename | sed 's/\.yaml$//')}

# Whether plan output $1 (exit status $2) asks for a cap: no plan fits one GPU, or its host-placed
# tables need more than the host budget (GB).
host_budget_gb=$(awk -v share="${HOST_SHARE:-0.6}" '/^MemAvailable/ {printf "%.1f", $2 * 1024 / 1e9 * share}' /proc/meminfo)
needs_cap() {
  { [ "$2" -ne 0 ] && grep -q "more GPUs\|does not fit on 1 x" "$1"; } && return 0
  [ "$2" -eq 0 ] || return 1
  local host
  host=$(grep -oE 'host memory \(tables\) +[0-9.]+' "$1" | awk '{print $NF}')
  [ -n "$host" ] && awk -v h="$host" -v b="$host_budget_gb" 'BEGIN { exit !(h > b) }'
}

rows_md=()
for m in $models; do
  say "$m"
  file=$MODEL_DIR/$m.yaml
  cap="-"
  run_bin "$P" plan --model "$file" --device "$DEVICE" --gpus 1 --out "$OUT/$m.plan.json" >"$OUT/$m.plan.txt" 2>&1
  rc=$?
  c=8000000
  while needs_cap "$OUT/$m.plan.txt" $rc && [ $c -ge 125000 ]; do
    file=$(capped "$MODEL_DIR/$m.yaml" $c)
    cap=$c
    run_bin "$P" plan --model "$file" --device "$DEVICE" --gpus 1 --out "$OUT/$m.plan.json" >"$OUT/$m.plan.txt" 2>&1
    rc=$?
    c=$((c / 2))
  done
  if [ $rc -ne 0 ]; then
    rows_md+=("| $m | $cap | no plan: $(grep -m1 -o 'error: .*' "$OUT/$m.plan.txt" | cut -c1-90) ||||||||||")
    continue
  fi
  plan_ms=$(grep -m1 -oE 'predicted: [0-9.]+ ms' "$OUT/$m.plan.txt" | grep -oE '[0-9.]+')
  floor_ms=$(grep -m1 -oE 'floor: [0-9.]+ ms' "$OUT/$m.plan.txt" | grep -oE '[0-9.]+')
  pred_gb=$(grep -m1 -oE '"peak_memory_bytes": *[0-9.e+]+' "$OUT/$m.plan.json" | awk -F: '{printf "%.2f", $2 / 1e9}')
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$OUT/$m.mem" 2>/dev/null &
  poll=$!
  run_bin timeout "$TIMEOUT" "$P" train --plan "$OUT/$m.plan.json" --model "$file" --steps "$STEPS" \
    --eval-examples 4096 --eval-every 0 --profile >"$OUT/$m.train.txt" 2>&1
  rc=$?
  kill $poll 2>/dev/null
  wait $poll 2>/dev/null
  if [ $rc -ne 0 ]; then
    rows_md+=("| $m | $cap | $plan_ms | refused or failed (exit $rc): $(grep -m1 -oE '(error|stopped|failed): .*' "$OUT/$m.train.txt" | cut -c1-160) |||||||||")
    continue
  fi
  peak_gb=$(sort -n "$OUT/$m.mem" | tail -1 | awk -v b="$base" '{printf "%.2f", ($1 - b) * 1048576 / 1e9}')
  # Device time of the step's ops (the categories the plan predicts: input_wait, the device waiting
  # for the host's batch, is not one), and the categories more than 1.3x their prediction by more
  # than 5% of the predicted step.
  dev_ms=$(awk '/^  category/ {on = 1; next} on && /sum of categories/ {on = 0}
    on && NF >= 2 && $1 != "input_wait" {s += $2} END {printf "%.3f", s}' "$OUT/$m.train.txt")
  wait_ms=$(awk '/^  input_wait/ {print $2}' "$OUT/$m.train.txt")
  # The span of making each batch on the device, beside the step (not in the device ms).
  synth_ms=$(awk '/^  synthetic_input/ {print $2}' "$OUT/$m.train.txt")
  wall_ms=$(awk '/wall time per step/ {print $5}' "$OUT/$m.train.txt")
  rate=$(grep -m1 -E '^done' "$OUT/$m.train.txt" | grep -oE '\([0-9.]+[kM]? after' | grep -oE '[0-9.]+[kM]?')
  over=$(awk -v plan="$plan_ms" '/^  category/ {on = 1; next} on && /sum of categories/ {on = 0}
    on && NF == 3 && $3 + 0 > 0 && $2 > 1.3 * $3 && $2 - $3 > 0.05 * plan {
      printf "%s%s %.2fx", sep, $1, $2 / $3; sep = ", "}' "$OUT/$m.train.txt")
  ratio=$(awk -v a="$dev_ms" -v b="$plan_ms" 'BEGIN {if (b > 0) printf "%.2f", a / b}')
  floor_x=$(awk -v a="$dev_ms" -v b="${floor_ms:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')
  rows_md+=("| $m | $cap | $plan_ms | $dev_ms | $ratio | $floor_x | ${over:--} | $wait_ms | ${synth_ms:--} | $wall_ms | $rate | $peak_gb / $pred_gb |")
done
OUT=$TABLE
device_after
tar -czf "$OUT/zoo-logs.tgz" -C "$SCRATCH" logs
{
  echo "| model | rows capped at | plan ms | device ms | device / plan | device / floor | categories over 1.3x | input wait ms | batch made on the device, ms beside the step | wall ms | examples/s (steady) | peak GPU GB measured / predicted |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows_md[@]}"
} | tee "$OUT/zoo.md"
