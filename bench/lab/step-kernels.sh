#!/usr/bin/env bash
# Where a planned training step's device time goes, kernel by kernel (an experiment, not a
# question): Nsight Compute's duration of every kernel of a few steps of MODEL as planned for one
# H200 (rows capped at ROWS if set, BATCH examples if set), summed by kernel name and grid over
# the last step, largest first. The step profile (parity train --profile) gives the same time by
# op; this splits an op into its kernels. The whole CSV is kept for a closer look.
#
#   PARITY_PREBUILT=build-pb5 MODEL=hstu-feed-1k BATCH=1024 bench/lab/step-kernels.sh
set -uo pipefail
bin=${PARITY_PREBUILT:-build-prebuilt}
export LD_LIBRARY_PATH=$PWD/$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
model=${MODEL:?MODEL names the zoo model}
steps=${STEPS:-3}
out=${OUT:-out}/step-kernels-$model
mkdir -p "$out"
"$bin/parity" plan --model "$model" --device h200 --gpus 1 --out "$out/plan.json" >"$out/plan.txt" 2>&1
train=("$bin/parity" train --plan "$out/plan.json" --steps "$steps" --eval-examples 64 --eval-every 0)
[ -n "${BATCH:-}" ] && train+=(--batch "$BATCH")
# The last step's kernels: those launched after the last "step_begin" mark kernel of the run are
# not distinguishable by name, so the run is profiled twice over: STEPS and STEPS-1 steps, and the
# difference of the two sums is one steady step.
for s in "$steps" $((steps - 1)); do
  args=("${train[@]}")
  args[5]=$s
  timeout "${TIMEOUT:-280}" ncu --clock-control none --csv --print-units base \
    --metrics gpu__time_duration.sum "${args[@]}" >"$out/ncu-$s.csv" 2>"$out/ncu-$s.err"
  echo "steps $s: exit $?" >>"$out/status.txt"
done
python3 - "$out/ncu-$steps.csv" "$out/ncu-$((steps - 1)).csv" <<'PY' | tee "$out/summary.txt"
import csv, re, sys, collections
def sums(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 14]
    if not rows: return {}, {}
    head = rows[0]; k = head.index("Kernel Name"); v = head.index("Metric Value")
    g = head.index("Grid Size"); b = head.index("Block Size")
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for r in rows[1:]:
        try: t = float(r[v].replace(",", ""))
        except ValueError: continue
        name = r[k].replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
        name = re.sub(r"<.*", "<>", re.sub(r"\(.*", "", name))[:60]
        key = f"{name} {r[g]} {r[b]}"
        tot[key] += t; cnt[key] += 1
    return tot, cnt
a, ca = sums(sys.argv[1]); b, cb = sums(sys.argv[2])
step = {key: a[key] - b.get(key, 0.0) for key in a}
calls = {key: ca[key] - cb.get(key, 0) for key in a}
s = sum(t for t in step.values() if t > 0)
print(f"{'kernel grid block':<100}{'calls':>6}{'ms':>9}{'share':>8}")
for n, t in sorted(step.items(), key=lambda x: -x[1])[:45]:
    if calls[n] <= 0: continue
    print(f"{n:<100}{calls[n]:>6}{t/1e6:>9.3f}{100*t/s:>7.1f}%")
print(f"one step: {s/1e6:.3f} ms of kernels")
PY
