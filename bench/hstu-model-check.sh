#!/usr/bin/env bash
# THE one script for "how fast does parity train an HSTU model on one GPU, and how fast does
# PyTorch train the same model there": run on the GPU machine from the repository root.
#
#   PARITY_PREBUILT=build-prebuilt bench/hstu-model-check.sh
#   MODELS="hstu-feed-1k" bench/hstu-model-check.sh
#
# First `hstu_torch.py --check` (its bucketed attention and table update against their formulas).
# Then per model (default hstu-feed-1k and hstu-commerce-2k): `parity plan` for one GPU (where no
# plan fits one GPU, every table's rows capped at 8M and then halved, as bench/zoo-check.sh does), `parity train --plan` for STEPS steps (steady examples/s), then
# bench/hstu_torch.py on the same (capped) model at the plan's batch, table dtype and dense math,
# eager and with torch.compile; a PyTorch run out of memory is retried at half the batch, twice.
# The table is printed last and written to $OUT/hstu-model.md (default out/hstu-model-check);
# every log goes into $OUT/hstu-model-logs.tgz. Environment: MODELS, STEPS (default 20),
# TORCH_STEPS (default 20), TORCH_TIMEOUT (seconds a PyTorch run, default 300), TORCH_PROFILE (set:
# the top CUDA kernels of each PyTorch run in its log).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" hstu-model-check
STEPS=${STEPS:-20}
TORCH_STEPS=${TORCH_STEPS:-20}
device_facts
find_binaries parity
TABLE=$OUT
OUT=$SCRATCH/logs
mkdir -p "$OUT"
P="$BIN/parity"
models=${MODELS:-hstu-feed-1k hstu-commerce-2k}

# A PyTorch run's examples/s and batch from its RESULT line ("-" when it has none).
torch_field() {  # LOG FIELD
  grep -m1 '^RESULT ' "$1" | sed 's/^RESULT //' |
    python3 -c "import json, sys; print(json.load(sys.stdin)['$2'])" 2>/dev/null || echo "-"
}

say "PyTorch peer's own check (hstu-tiny)"
python3 bench/hstu_torch.py --check >"$OUT/torch-check.txt" 2>&1
check_rc=$?
tail -3 "$OUT/torch-check.txt"
rows_md=()
for m in $models; do
  say "$m: plan"
  file=configs/models/$m.yaml
  cap="-"
  run_bin "$P" plan --model "$file" --device h200 --gpus 1 --out "$OUT/$m.plan.json" >"$OUT/$m.plan.txt" 2>&1
  rc=$?
  c=8000000
  while [ $rc -ne 0 ] && grep -q "more GPUs\|not sharded\|does not fit on 1 x" "$OUT/$m.plan.txt" && [ $c -ge 125000 ]; do
    file=$(capped "$m" $c)
    cap=$c
    run_bin "$P" plan --model "$file" --device h200 --gpus 1 --out "$OUT/$m.plan.json" >"$OUT/$m.plan.txt" 2>&1
    rc=$?
    c=$((c / 2))
  done
  if [ $rc -ne 0 ]; then
    rows_md+=("| $m | $cap | no plan: $(grep -m1 -o 'error: .*' "$OUT/$m.plan.txt" | cut -c1-90) ||||||")
    continue
  fi
  read -r batch dtype math < <(python3 -c "
import json; p = json.load(open('$OUT/$m.plan.json'))
print(p['per_device_batch'], 'fp16' if any(t['dtype'] == 'fp16' for t in p['tables']) else 'fp32', p['dense_math'])")
  plan_rate=$(grep -m1 -oE 'ms/step, [0-9.e+]+[kM]? examples/s' "$OUT/$m.plan.txt" | grep -oE '[0-9.e+]+[kM]? examples' | cut -d' ' -f1)
  say "$m: parity train --plan (batch $batch, tables $dtype, $math)"
  run_bin timeout 300 "$P" train --plan "$OUT/$m.plan.json" --model "$file" --steps "$STEPS" \
    --eval-examples 4096 --eval-every 0 >"$OUT/$m.parity.txt" 2>&1
  parity_rate=$(steady "$OUT/$m.parity.txt")
  cells=()
  for mode in eager compile; do
    b=$batch
    for _ in 1 2 3; do
      say "$m: PyTorch $mode at batch $b"
      log=$OUT/$m.torch-$mode-$b.txt
      flags=()
      [ $mode = compile ] && flags=(--compile)
      [ -n "${TORCH_PROFILE:-}" ] && flags+=(--profile)
      PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-300}" python3 bench/hstu_torch.py --model "$file" --batch "$b" \
        --dense-math "$math" --table-dtype "$dtype" --steps "$TORCH_STEPS" "${flags[@]}" \
        >"$log" 2>&1
      rc=$?
      tail -2 "$log"
      [ $rc -eq 3 ] || break
      b=$((b / 2))
    done
    rate=$(torch_field "$log" examples_per_s)
    cells+=("$rate (batch $(torch_field "$log" batch))")
    [ "$mode" = compile ] && compile_rate=$rate
  done
  ratio=$(awk -v a="${parity_rate:-0}" -v b="${compile_rate:-0}" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "-"}')
  rows_md+=("| $m | $cap | $batch, $dtype tables, $math | $plan_rate | ${parity_rate:--} | ${cells[0]} | ${cells[1]} | $ratio |")
done
OUT=$TABLE
device_after
tar -czf "$OUT/hstu-model-logs.tgz" -C "$SCRATCH" logs
{
  echo "| model | rows capped at | plan: batch, tables, dense math | plan examples/s | parity examples/s (steady) | PyTorch eager | PyTorch torch.compile | parity / torch.compile |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows_md[@]}"
  echo
  echo "hstu_torch.py --check: exit $check_rc"
} | tee "$OUT/hstu-model.md"
