#!/usr/bin/env bash
# How far does a model's smoothed training loss move when every dense product rounds its operands
# (an experiment, on the CPU, no GPU needed)? The cpu backend sums in double from fp32 operands;
# cpu-rounded-products.patch rounds each operand first to PARITY_LAB_ROUND_BITS significant bits
# (8: bf16's, 11: tf32's, 23: one bit under fp32's). A model whose windows move by more than the
# numerics bound (0.3%, bench/numerics-check.sh) at 23 bits amplifies any rounding: no two
# implementations of it can agree within the bound. docs/reliability.md has the figures.
#
#   bench/lab/rounding-sensitivity.sh
#
# Builds the patched tree (cpu backend only) in a scratch worktree, then per model of MODELS
# (default "tiny tiny-dot") and dense initial accumulator of ACCUMULATORS (default "0 0.01": the
# models' dense optimizer with that initial_accumulator; 0 for none) and seed of SEEDS (default
# 1), one run with exact operands and one per BITS (default "23 11 8"), STEPS (2000) steps at the
# model's batch, windows of WINDOW (100) steps. Prints each window's relative difference, the
# worst and the held-out AUC of both runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MODELS:-tiny tiny-dot}
ACCUMULATORS=${ACCUMULATORS:-0 0.01}
BITS=${BITS:-23 11 8}
SEEDS=${SEEDS:-1}
STEPS=${STEPS:-2000}
WINDOW=${WINDOW:-100}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/parity-rounding.XXXXXX")
trap 'git worktree remove --force "$SCRATCH/tree" >/dev/null 2>&1; rm -rf "$SCRATCH"' EXIT

git worktree add --detach "$SCRATCH/tree" HEAD >/dev/null
git -C "$SCRATCH/tree" apply "$PWD/bench/lab/cpu-rounded-products.patch"
cmake -S "$SCRATCH/tree" -B "$SCRATCH/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPARITY_BACKENDS=cpu -DPARITY_BUILD_TESTS=OFF >/dev/null
cmake --build "$SCRATCH/build" --target parity -j "$(nproc)" >/dev/null
parity=$SCRATCH/build/parity

for m in $MODELS; do
  for acc in $ACCUMULATORS; do
    spec=$SCRATCH/$m-$acc.yaml
    # The dense optimizer's map with its initial_accumulator replaced (or dropped, for 0).
    python3 - "configs/models/$m.yaml" "$acc" >"$spec" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
acc = float(sys.argv[2])
def dense(match):
    body = re.sub(r",\s*initial_accumulator:\s*[^,}]+", "", match.group(1))
    return "dense: {" + body + (f", initial_accumulator: {sys.argv[2]}" if acc else "") + "}"
out, n = re.subn(r"dense:\s*\{([^}]*)\}", dense, text)
if n != 1:
    sys.exit(f"{sys.argv[1]}: expected one dense optimizer map, found {n}")
print(out, end="")
PY
    for seed in $SEEDS; do
      run() {  # BITS LOG: one run, its window means in LOG.txt
        PARITY_LAB_ROUND_BITS=$1 OMP_NUM_THREADS=1 "$parity" train --model "$spec" --backend cpu \
          --no-plan --seed "$seed" --steps "$STEPS" --eval-every 0 --eval-examples 65536 \
          --loss-log "$2.txt" --loss-window "$WINDOW" >"$2.log" 2>&1
      }
      base=$SCRATCH/$m-$acc-$seed-exact
      run 0 "$base" &
      for b in $BITS; do run "$b" "$SCRATCH/$m-$acc-$seed-$b" & done
      wait
      for b in $BITS; do
        python3 - "$base" "$SCRATCH/$m-$acc-$seed-$b" \
          "$m, initial_accumulator $acc, seed $seed, $b bits" <<'PY'
import re, sys
def windows(p):
    return [float(l.split()[1]) for l in open(p + ".txt") if not l.startswith("#")]
def auc(p):
    return re.findall(r"AUC ([0-9.]+)", open(p + ".log").read())[-1]
x, y = windows(sys.argv[1]), windows(sys.argv[2])
d = [100 * (b - a) / a for a, b in zip(x, y)]
print(f"{sys.argv[3]}: worst {max(map(abs, d)):.3f}%, AUC {auc(sys.argv[1])} / "
      f"{auc(sys.argv[2])}; windows " + " ".join(f"{v:+.2f}" for v in d))
PY
      done
    done
  done
done
