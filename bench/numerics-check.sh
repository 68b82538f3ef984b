#!/usr/bin/env bash
# Do the GPU's numerics track the CPU reference's over a whole run? For each model, the same run
# (seed, batch, steps, the model's own recipe: --no-plan) on the cpu backend, on the GPU in fp32
# dense math and on the GPU in bf16, each writing the mean training loss of every window of
# WINDOW steps (--loss-log); then every window's mean compared, GPU fp32 against the CPU and GPU
# bf16 against GPU fp32, within 0.3% relative, and the final held-out AUC within 0.002
# (docs/reliability.md, "Numerics across backends"). The cpu runs go side by side with the GPU's.
#
#   PARITY_PREBUILT=build-prebuilt bench/numerics-check.sh
#
# Environment: MODELS (default "tiny tiny-dot prod-ads-small"), STEPS (2000), WINDOW (100), BATCH
# (2048; a model's own batch where smaller, unless FORCE_BATCH=1), CAP (rows of every table capped
# here: 200000), EVAL_EXAMPLES (65536), SEED (1: initialisation and data). Beside each worst
# window the mean of the windows' signed differences: near zero where the runs part by chance,
# away from it where one math trains faster or slower than the other. The table is printed
# last and written to $OUT/numerics.md; the exit status is non-zero where a bound does not hold or
# a run fails.
set -uo pipefail
. "$(dirname "$0")/common.sh" numerics
MODELS=${MODELS:-tiny tiny-dot prod-ads-small}
STEPS=${STEPS:-2000}
WINDOW=${WINDOW:-100}
BATCH=${BATCH:-2048}
CAP=${CAP:-200000}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-65536}
SEED=${SEED:-1}
find_binaries parity || exit 1
device_facts
status=0
rows=()
for m in $MODELS; do
  spec=$(capped "$m" "$CAP")
  own=$(awk '/^batch_size:/ {print $2}' "configs/models/$m.yaml")
  b=$BATCH
  [ "${FORCE_BATCH:-0}" != 1 ] && [ -n "$own" ] && [ "$own" -lt "$b" ] && b=$own
  common=(train --model "$spec" --no-plan --seed "$SEED" --steps "$STEPS" --batch "$b" --eval-every 0
    --eval-examples "$EVAL_EXAMPLES" --loss-window "$WINDOW")
  say "$m: batch $b, $STEPS steps, seed $SEED"
  run_bin "$BIN/parity" "${common[@]}" --backend cpu --loss-log "$OUT/$m.cpu.txt" >"$OUT/$m.cpu.log" 2>&1 &
  cpu=$!
  run_bin "$BIN/parity" "${common[@]}" --backend gpu --dense-math fp32 --loss-log "$OUT/$m.fp32.txt" \
    >"$OUT/$m.fp32.log" 2>&1 || status=1
  run_bin "$BIN/parity" "${common[@]}" --backend gpu --dense-math bf16 --loss-log "$OUT/$m.bf16.txt" \
    >"$OUT/$m.bf16.log" 2>&1 || status=1
  wait $cpu || status=1
  row=$(PYTHONPATH=bench python3 - "$OUT/$m" <<'PY'
import sys
from loss_windows import last_auc, mean, relative, windows, worst
base = sys.argv[1]
try:
    c, f, b = (windows(f"{base}.{k}.txt") for k in ("cpu", "fp32", "bf16"))
except OSError as e:
    print(f"| run failed: {e} |||||||"); sys.exit(0)
d1, d2 = relative(f, c), relative(b, f)
w1, w2 = worst(d1), worst(d2)
a = [last_auc(f"{base}.{k}.log") for k in ("cpu", "fp32", "bf16")]
ok = w1 <= 0.003 and w2 <= 0.003 and abs(a[1] - a[0]) <= 0.002 and abs(a[2] - a[1]) <= 0.002
print(f"| {len(c)} | {100 * w1:.3f}% / {100 * mean(d1):+.3f}% | {100 * w2:.3f}% / {100 * mean(d2):+.3f}% "
      f"| {a[0]:.4f} | {a[1]:.4f} | {a[2]:.4f} | {'yes' if ok else 'NO'} |")
PY
)
  [[ $row == *"| yes |" ]] || status=1
  rows+=("| $m (batch $b) $row")
done
{
  echo "| model | windows of $WINDOW steps | GPU fp32 vs CPU: worst window / mean | GPU bf16 vs GPU fp32: worst / mean | AUC cpu | AUC GPU fp32 | AUC GPU bf16 | within 0.3% and 0.002 |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/numerics.md"
exit $status
