#!/usr/bin/env bash
# THE one script for "what is 1.6x the memory worth, and does the planner know": run on the GPU
# machine from the repository root.
#
#   PARITY_PREBUILT=build-prebuilt bench/capacity-check.sh
#   MODELS="mlperf-dlrmv2 hstu-feed-1k" STEPS=40 PROFILE=1 bench/capacity-check.sh
#
# The same H200 stands for both devices: whole (141 GB) for the larger, and limited to 141/RATIO
# GB for the smaller (`parity train --memory-limit`: the rest of its memory reserved at
# start-up). The smaller device's file is a copy of configs/devices/h200.yaml with that
# memory.hbm_bytes and nothing else changed, so both plans read the same calibration.
#
# Per model:
#   1. `parity plan` for each memory;
#   2. `parity train --plan` of each plan, on the memory it was made for, STEPS steps;
#   3. each plan's batch, table precisions and placement, predicted and measured (steady)
#      examples/s, and the predicted and measured gain of the larger memory.
# The table is printed last and written to $OUT/capacity.md (default out/capacity-check); every
# log goes into $OUT/logs.
# Environment: MODELS (default: mlperf-dlrmv2 prod-video-recs hstu-feed-1k: each fits a GPU machine
# with 125 GiB of host memory when limited; mlperf-dlrmv2-adagrad needs 165 GB), STEPS (default
# 300: host-placed tables' caches are re-chosen at steps 4, 16, 64 and 256, seconds each, which a
# short run does not amortise), RATIO (default 1.6), TRAIN_TIMEOUT (seconds a training run,
# default 500), PROFILE (default 1; empty: no `--profile`, and no rates without the refreshes,
# which the profile reports).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" capacity-check
STEPS=${STEPS:-300}
PROFILE=${PROFILE-1}
RATIO=${RATIO:-1.6}
models=${MODELS:-mlperf-dlrmv2 prod-video-recs hstu-feed-1k}
device_facts
find_binaries parity
P="$BIN/parity"
LOGS=$OUT/logs
mkdir -p "$LOGS"

small_gb=$(python3 -c "print(round(141.0 / $RATIO, 3))")
small=$LOGS/h200-limited.yaml
sed -e "s/^display_name: .*/display_name: NVIDIA H200 limited to $small_gb GB/" \
  -e "s|hbm_bytes: {value: 141.0e9, source: \"[^\"]*\"}|hbm_bytes: {value: ${small_gb}e9, source: \"141 GB / $RATIO: the H200 standing in for a GPU with $RATIO x less memory (bench/capacity-check.sh)\"}|" \
  configs/devices/h200.yaml >"$small"
grep -q "value: ${small_gb}e9" "$small" || {
  echo "capacity-check: configs/devices/h200.yaml has no 'hbm_bytes: {value: 141.0e9, ...}' to limit"
  exit 1
}

# A plan's batch, tables and prediction: "batch|tables|examples/s".
plan_facts() {  # PLAN_JSON
  python3 -c "
import collections, json
p = json.load(open('$1'))
t = p['tables']
dtypes = collections.Counter(x['dtype'] for x in t)
host = sum(1 for x in t if x.get('placement') == 'host')
tables = ', '.join(f'{k} x{v}' for k, v in sorted(dtypes.items())) if t else 'sequence tables'
if host: tables += f', {host} in host memory'
print(f\"{p['global_batch']}|{tables}|{p['prediction']['examples_per_s']:.0f}\")"
}
# The steady rate of a --profile log without its cache refreshes (one-time costs that a long run
# amortises: they come at steps 4, 16, 64, 256, ...), or the steady rate where it had none.
without_refreshes() {  # LOG BATCH STEADY
  python3 -c "
import re, sys
text = open('$1').read()
wall = re.search(r'wall time per step +([0-9.]+)', text)
ref = re.search(r'cache refreshes took ([0-9.]+) s', text)
if not wall or not ref: print('${3:-}'); sys.exit()
ms = float(wall.group(1)) - 1e3 * float(ref.group(1)) / max($STEPS - 2, 1)
print(f'{$2 * 1e3 / ms:.0f}')"
}
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "-"}'; }

rows=()
for m in $models; do
  declare -A facts=() rate=() amortised=()
  for size in whole limited; do
    dev=h200
    limit=()
    [ -n "${PROFILE:-}" ] && limit=(--profile)
    if [ $size = limited ]; then
      dev=$small
      limit+=(--memory-limit "$small_gb")
    fi
    say "$m: plan for the $size H200"
    if ! run_bin "$P" plan --model "$m" --device "$dev" --gpus 1 --out "$LOGS/$m.$size.plan.json" \
      >"$LOGS/$m.$size.plan.txt" 2>&1; then
      facts[$size]="-|no plan: $(grep -m1 -o 'error: .*' "$LOGS/$m.$size.plan.txt" | cut -c1-80)|0"
      continue
    fi
    facts[$size]=$(plan_facts "$LOGS/$m.$size.plan.json")
    say "$m: train the $size plan (${facts[$size]})"
    run_bin timeout "${TRAIN_TIMEOUT:-500}" "$P" train --plan "$LOGS/$m.$size.plan.json" --model "$m" --steps "$STEPS" \
      --eval-examples 4096 --eval-every 0 "${limit[@]}" >"$LOGS/$m.$size.train.txt" 2>&1
    echo "   exit $?: $(grep -m1 -E '^done|error' "$LOGS/$m.$size.train.txt")"
    rate[$size]=$(steady "$LOGS/$m.$size.train.txt")
    IFS='|' read -r batch _ _ <<<"${facts[$size]}"
    amortised[$size]=$(without_refreshes "$LOGS/$m.$size.train.txt" "$batch" "${rate[$size]}")
  done
  IFS='|' read -r wb wt wp <<<"${facts[whole]}"
  IFS='|' read -r lb lt lp <<<"${facts[limited]}"
  rows+=("| $m | $lb, $lt | $wb, $wt | $(printf '%.0f' "${lp:-0}") / ${rate[limited]:--} (${amortised[limited]:--}) | $(printf '%.0f' "${wp:-0}") / ${rate[whole]:--} (${amortised[whole]:--}) | $(ratio "$wp" "$lp") | $(ratio "${rate[whole]:-}" "${rate[limited]:-}") ($(ratio "${amortised[whole]:-}" "${amortised[limited]:-}")) |")
  unset facts rate amortised
done
device_after
{
  echo "| model | plan for $small_gb GB: batch, tables | plan for 141 GB: batch, tables | $small_gb GB: predicted / measured examples/s (without cache refreshes) | 141 GB: predicted / measured examples/s (without cache refreshes) | predicted gain | measured gain (without cache refreshes) |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/capacity.md"
