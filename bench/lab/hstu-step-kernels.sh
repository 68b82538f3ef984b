#!/usr/bin/env bash
# Where an HSTU training step's device time goes, kernel by kernel (an experiment, not a
# question): Nsight Compute's duration of every kernel of a few planned training steps of MODEL
# (default hstu-feed-1k) at BATCH examples (default 1024), summed by kernel name and grid, largest
# first. The step profile (parity train --profile) gives the same time by op; this splits an op
# into its kernels.
#
#   PARITY_PREBUILT=build-pb5 bench/lab/hstu-step-kernels.sh
set -uo pipefail
bin=${PARITY_PREBUILT:-build-prebuilt}
export LD_LIBRARY_PATH=$PWD/$bin/lib
model=${MODEL:-hstu-feed-1k}
out=${OUT:-out/hstu-step-kernels}
mkdir -p "$out"
"$bin/parity" plan --model "$model" --device h200 --out "$out/plan.json" >"$out/plan.txt" 2>&1
timeout 300 ncu --csv --print-units base --metrics gpu__time_duration.sum \
  "$bin/parity" train --plan "$out/plan.json" --batch "${BATCH:-1024}" --steps "${STEPS:-3}" \
  --eval-examples 64 >"$out/ncu.csv" 2>"$out/ncu.err"
python3 - "$out/ncu.csv" "${STEPS:-3}" <<'PY'
import csv, re, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
head = rows[0]; k = head.index("Kernel Name"); v = head.index("Metric Value"); g = head.index("Grid Size")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: t = float(r[v])
    except ValueError: continue
    name = re.sub(r"\(.*", "", r[k]); name = re.sub(r"<.*", "<>", name)[:70]
    tot[name] += t; cnt[name] += 1
s = sum(tot.values())
print(f"{'kernel':<72}{'calls':>7}{'ms total':>11}{'share':>8}")
for n, t in sorted(tot.items(), key=lambda x: -x[1])[:40]:
    print(f"{n:<72}{cnt[n]:>7}{t/1e6:>11.3f}{100*t/s:>7.1f}%")
print(f"all kernels {s/1e6:.3f} ms over the whole run (startup and evaluation included)")
PY
