#!/usr/bin/env bash
# How does a model sharded by the planner scale over this machine's GPUs, how close is the plan's
# prediction, what does co-design gain over a naive plan, and does a checkpoint reshard across GPU
# counts? On a machine with several GPUs, from the repository root:
#   1. for each GPU count of COUNTS: the planner's plan for MODEL on DEVICE, trained STEPS steps
#      (one rank a GPU, NCCL between them) with --profile: examples/s, per GPU, the scaling
#      efficiency per GPU against one GPU, the plan's predicted examples/s and its error, and the
#      step's embedding exchange and exposed dense all-reduce, measured beside the plan;
#   2. co-design: at the largest count, the plan made for NAIVE (default h100, an 80 GB GPU) run on
#      these GPUs unchanged, against the plan made for them;
#   3. resharding: RESHARD_MODEL (tables in fp32) trained 20 steps over the largest count with
#      checkpoints, resumed over 2 GPUs to step 30 and on 1 to step 40, against one GPU training
#      40 steps without a stop: the printed loss and AUC must be equal.
#
#   PARITY_PREBUILT=build-prebuilt bench/scaling-check.sh
#
# Environment: MODEL (mlperf-dlrmv2), DEVICE (h200), COUNTS (1 2 4 8: those up to GPUS, by
# default the GPUs nvidia-smi lists), STEPS (100), NAIVE (h100), RESHARD_MODEL (tiny),
# TRAIN_FLAGS (more flags for every parity train: "--backend cpu --collectives mpi" rehearses the
# script on a machine without a GPU, with GPUS=2 and a small MODEL). The table is printed last
# and written to $OUT/scaling-check.md (docs/perf/scaling.md takes it with the commands); the exit
# status is non-zero where a run fails or the resharding does not continue exactly.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" scaling-check
MODEL=${MODEL:-mlperf-dlrmv2}
DEVICE=${DEVICE:-h200}
STEPS=${STEPS:-100}
NAIVE=${NAIVE:-h100}
RESHARD_MODEL=${RESHARD_MODEL:-tiny}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
read -r -a extra <<<"${TRAIN_FLAGS:-}"
COUNTS=${COUNTS:-1 2 4 8}
find_binaries parity || exit 1
device_facts
P="$BIN/parity"
status=0
counts=()
for n in $COUNTS; do [ "$n" -le "$GPUS" ] && counts+=("$n"); done
[ "${#counts[@]}" -gt 0 ] || {
  echo "no count of COUNTS ($COUNTS) fits the $GPUS GPUs listed" >&2
  exit 1
}
largest=${counts[-1]}

# A run of N ranks, one a GPU: mpirun where there are several.
on() {  # N CMD...
  local n=$1
  shift
  local mpi=(mpirun --allow-run-as-root --oversubscribe -np "$n" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
  [ -n "${PARITY_CONFIGS:-}" ] && mpi+=(-x PARITY_CONFIGS)
  if [ "$n" -gt 1 ]; then
    run_bin "${mpi[@]}" "$@" "${extra[@]}"
  else
    run_bin "$@" "${extra[@]}"
  fi
}
# The plan file's predicted examples/s.
predicted() { python3 -c 'import json,sys; print("%.0f" % json.load(open(sys.argv[1]))["prediction"]["examples_per_s"])' "$1"; }
# A category's measured and planned ms of a --profile log ("  name  measured  plan").
category() { awk -v c="$2" '$1 == c {print $2 " / " $3; exit}' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.3f", a / b; else print "-"}'; }

rows=()
base_per_gpu=""
for n in "${counts[@]}"; do
  say "$MODEL over $n GPUs"
  "$P" plan --model "$MODEL" --device "$DEVICE" --gpus "$n" --out "$OUT/plan-$n.json" \
    >"$OUT/plan-$n.txt" 2>&1 || { status=1; continue; }
  on "$n" "$P" train --plan "$OUT/plan-$n.json" --steps "$STEPS" --profile --eval-examples 65536 \
    --eval-every 0 >"$OUT/train-$n.log" 2>&1 || status=1
  got=$(steady "$OUT/train-$n.log")
  want=$(predicted "$OUT/plan-$n.json")
  per_gpu=$(awk -v a="$got" -v n="$n" 'BEGIN {if (a > 0) printf "%.0f", a / n}')
  [ "$n" -eq 1 ] && base_per_gpu=$per_gpu
  eff=$([ -n "$base_per_gpu" ] && ratio "$per_gpu" "$base_per_gpu" || echo "-")
  rows+=("| $n | ${got:-failed} | ${per_gpu:--} | $eff | $want | $(ratio "$got" "$want") | $(category "$OUT/train-$n.log" embedding_exchange) | $(category "$OUT/train-$n.log" dense_allreduce_exposed) |")
done

say "co-design: the plan made for $NAIVE run on $largest x $DEVICE"
naive=""
if "$P" plan --model "$MODEL" --device "$NAIVE" --gpus "$largest" --out "$OUT/plan-naive.json" \
  >"$OUT/plan-naive.txt" 2>&1; then
  on "$largest" "$P" train --plan "$OUT/plan-naive.json" --steps "$STEPS" --profile \
    --eval-examples 65536 --eval-every 0 >"$OUT/train-naive.log" 2>&1 || status=1
  naive=$(steady "$OUT/train-naive.log")
else
  naive="no plan fits $NAIVE (plan-naive.txt)"
fi

say "resharding: $RESHARD_MODEL over $largest, then 2, then 1 GPU"
reshard="not run (one GPU)"
if [ "$largest" -ge 2 ]; then
  R=$SCRATCH/reshard
  mkdir -p "$R"
  for g in 1 2 "$largest"; do
    "$P" plan --model "$RESHARD_MODEL" --device "$DEVICE" --gpus "$g" --out "$R/p$g-planned.json" >/dev/null
    # fp32 tables: 16-bit tables' stochastic roundings follow the gradients' summation order.
    sed -E 's/"dtype": "(fp16|bf16)"/"dtype": "fp32"/g' "$R/p$g-planned.json" >"$R/p$g.json"
  done
  # Stages as the CPU's ctest dist.train_resume_4_2_1_4: the printed loss and AUC of step 40 must
  # equal one GPU's without a stop (ranks sum the dense gradients in another order, so the last
  # bits of a long run differ; the checkpoints themselves reshard bit for bit, dist.resharding_*).
  common=(--checkpoint "$R/ck" --checkpoint-every 10 --eval-examples 1024)
  on "$largest" "$P" train --plan "$R/p$largest.json" --steps 20 "${common[@]}" >"$OUT/reshard-1.log" 2>&1 || status=1
  on 2 "$P" train --plan "$R/p2.json" --steps 30 --resume "${common[@]}" >"$OUT/reshard-2.log" 2>&1 || status=1
  on 1 "$P" train --plan "$R/p1.json" --steps 40 --resume "${common[@]}" >"$OUT/reshard-3.log" 2>&1 || status=1
  on 1 "$P" train --plan "$R/p1.json" --steps 40 --eval-examples 1024 >"$OUT/reshard-whole.log" 2>&1 || status=1
  ending() { grep -o 'final loss [0-9.]*  AUC [0-9.]*' "$1"; }
  a=$(ending "$OUT/reshard-3.log")
  b=$(ending "$OUT/reshard-whole.log")
  resumed=0
  grep -q 'resumed at step 20' "$OUT/reshard-2.log" && resumed=$((resumed + 1))
  grep -q 'resumed at step 30' "$OUT/reshard-3.log" && resumed=$((resumed + 1))
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$resumed" -eq 2 ]; then
    reshard="$largest -> 2 -> 1 GPUs: step 40 $a, one GPU without a stop $b: equal"
  else
    reshard="$largest -> 2 -> 1 GPUs: step 40 '${a:-none}', one GPU without a stop '${b:-none}', $resumed of 2 resumes at their steps: NOT equal"
    status=1
  fi
fi
device_after

{
  echo "| GPUs | examples/s | per GPU | per-GPU efficiency vs 1 | plan's examples/s | measured / plan | embedding_exchange ms (measured / plan) | dense_allreduce_exposed ms (measured / plan) |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "co-design on $largest x $DEVICE: its own plan $(steady "$OUT/train-$largest.log") examples/s, the plan made for $NAIVE ${naive:-failed}"
  echo "resharding: $reshard"
} | tee "$OUT/scaling-check.md"
exit $status
