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
# (default "tiny tiny-dot"), dense optimizer of DENSE (maps as a model file writes them, separated
# by ";", e.g. "{kind: adagrad, lr: 0.05, eps: 1.0e-8, initial_accumulator: 0.01}"; default: the
# model's own), table optimizer of EMBEDDING (the same, for the tables) and seed of SEEDS
# (default 1), one run with exact operands and one per BITS (default "23 11 8"), STEPS (2000)
# steps of BATCH examples (default: the model's batch), windows of WINDOW (100) steps. Prints
# each window's relative difference, their worst and mean, and the held-out AUC of both runs.
# EXTRA_PATCH: a further patch for the scratch tree, e.g. bench/lab/first-order-teacher.patch (the
# synthetic teacher without its products of two tables and of a table and a dense feature) or
# bench/lab/shared-row-teacher.patch (those products of the rows' first-order values, not of
# values of their own).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MODELS:-tiny tiny-dot}
DENSE=${DENSE:-}
EMBEDDING=${EMBEDDING:-}
BATCH=${BATCH:-}
BITS=${BITS:-23 11 8}
SEEDS=${SEEDS:-1}
STEPS=${STEPS:-2000}
WINDOW=${WINDOW:-100}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/parity-rounding.XXXXXX")
trap 'git worktree remove --force "$SCRATCH/tree" >/dev/null 2>&1; rm -rf "$SCRATCH"' EXIT

git worktree add --detach "$SCRATCH/tree" HEAD >/dev/null
git -C "$SCRATCH/tree" apply "$PWD/bench/lab/cpu-rounded-products.patch"
if [ -n "${EXTRA_PATCH:-}" ]; then
  [[ $EXTRA_PATCH == /* ]] || EXTRA_PATCH=$PWD/$EXTRA_PATCH  # relative to the repository root
  git -C "$SCRATCH/tree" apply "$EXTRA_PATCH"
fi
cmake -S "$SCRATCH/tree" -B "$SCRATCH/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPARITY_BACKENDS=cpu -DPARITY_BUILD_TESTS=OFF >/dev/null
cmake --build "$SCRATCH/build" --target parity -j "$(nproc)" >/dev/null
parity=$SCRATCH/build/parity

dense=() tables=()
IFS=';' read -r -a dense <<<"$DENSE"
IFS=';' read -r -a tables <<<"$EMBEDDING"
[ ${#dense[@]} -gt 0 ] || dense=("")
[ ${#tables[@]} -gt 0 ] || tables=("")
for m in $MODELS; do
  for d in "${!dense[@]}"; do for e in "${!tables[@]}"; do
    v=$d-$e
    spec=$SCRATCH/$m-$v.yaml
    # The model with its optimizers' maps replaced (each kept where its variable is empty).
    python3 - "configs/models/$m.yaml" "${dense[$d]}" "${tables[$e]}" >"$spec" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for key, value in (("dense", sys.argv[2].strip()), ("embedding", sys.argv[3].strip())):
    if value:
        text, n = re.subn(key + r":\s*\{[^}]*\}", lambda _: f"{key}: {value}", text)
        if n != 1:
            sys.exit(f"{sys.argv[1]}: expected one {key} optimizer map, found {n}")
print(text, end="")
PY
    what="$m, $(grep -oE 'embedding: *\{[^}]*\}' "$spec"), $(grep -oE 'dense: *\{[^}]*\}' "$spec")"
    for seed in $SEEDS; do
      run() {  # BITS LOG: one run, its window means in LOG.txt
        PARITY_LAB_ROUND_BITS=$1 OMP_NUM_THREADS=1 "$parity" train --model "$spec" --backend cpu \
          --no-plan --seed "$seed" --steps "$STEPS" ${BATCH:+--batch "$BATCH"} --eval-every 0 \
          --eval-examples 65536 --loss-log "$2.txt" --loss-window "$WINDOW" >"$2.log" 2>&1
      }
      base=$SCRATCH/$m-$v-$seed-exact
      run 0 "$base" &
      for b in $BITS; do run "$b" "$SCRATCH/$m-$v-$seed-$b" & done
      wait
      for b in $BITS; do
        python3 - "$base" "$SCRATCH/$m-$v-$seed-$b" "$what, seed $seed, $b bits" <<'PY'
import re, sys
def windows(p):
    return [float(l.split()[1]) for l in open(p + ".txt") if not l.startswith("#")]
def auc(p):
    return re.findall(r"AUC ([0-9.]+)", open(p + ".log").read())[-1]
x, y = windows(sys.argv[1]), windows(sys.argv[2])
d = [100 * (b - a) / a for a, b in zip(x, y)]
print(f"{sys.argv[3]}: worst {max(map(abs, d)):.3f}%, mean {sum(d) / len(d):+.3f}%, AUC "
      f"{auc(sys.argv[1])} / {auc(sys.argv[2])}; windows " + " ".join(f"{v:+.2f}" for v in d))
PY
      done
    done
  done; done
done
