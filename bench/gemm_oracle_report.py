#!/usr/bin/env python3
"""Summary of a kernel-selection oracle run (bench/gemm_bench.cpp's JSON lines, gzipped or not).

Why it exists: the figures docs/perf/kernel-selection.md quotes, recomputed from the data file a
run wrote, so that each one can be checked and later runs compared the same way. Per operand type:
the problems, the library's accepted configurations per problem (median, largest), the host time
of the enumeration walk and of the heuristic, the heuristic's first answer and the best of its
answers as a fraction of the best configuration timed (geomean, worst), by problem size (the best
time under 20 us, under 200 us, longer) and weighted by time (the suite's summed best time over
its summed time with the heuristic's first answer), which algorithm ids hold the best times, and,
for a run with a kernel catalog (gemm_bench --catalog), the model's pick against the best timed,
its predicted time against the measured, and the selection time.

Usage: python3 bench/gemm_oracle_report.py FILE.jsonl[.gz] [...]
"""
import collections
import gzip
import json
import math
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def geomean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else 0


def report(rows):
    by_type = collections.defaultdict(list)
    for r in rows:
        by_type[r["problem"]["type"]].append(r)
    for t, rs in by_type.items():
        timed = []
        for r in rs:
            c = [x for x in r.get("candidates", []) if "us" in x]
            if c:
                timed.append((r, c))
        wrong = sum(1 for r in rs for x in r.get("candidates", []) if x.get("wrong"))
        print(f"{t}: {len(rs)} problems, {len(rs) - len(timed)} without a kernel, "
              f"{wrong} configurations computing something else")
        print(f"  accepted configurations a problem: median {median([r['accepted'] for r in rs])}, "
              f"largest {max(r['accepted'] for r in rs)} (of {median([r['checked'] for r in rs])} "
              f"checked, median; {rs[0]['algorithms']} algorithm ids)")
        print(f"  host time a problem: enumeration {median([r['enumerate_us'] for r in rs]):.0f} us, "
              f"heuristic (32 answers) {median([r['heuristic_us'] for r in rs]):.0f} us (medians)")
        print(f"  configurations timed a problem: median {median([len(c) for _, c in timed])}")
        classes = collections.defaultdict(lambda: ([], [], [0.0, 0.0]))
        wins = collections.Counter()
        for r, c in timed:
            best = min(x["us"] for x in c)
            first = c[0]["us"] if c[0].get("heuristic_rank") == 0 else None
            heur = [x["us"] for x in c if x.get("heuristic_rank", -1) >= 0]
            wins[min(c, key=lambda x: x["us"])["algo"]] += 1
            if first is None:
                continue
            for key in ("all", "<20us" if best < 20 else "<200us" if best < 200 else ">=200us"):
                f, h, w = classes[key]
                f.append(best / first)
                h.append(best / min(heur))
                w[0] += best
                w[1] += first
        for key in ("all", "<20us", "<200us", ">=200us"):
            if key not in classes:
                continue
            f, h, w = classes[key]
            print(f"  {key:>7}: {len(f):3d} problems; heuristic's first {100 * geomean(f):.1f}% of the "
                  f"best timed (worst {100 * min(f):.1f}%), best of its answers {100 * geomean(h):.1f}% "
                  f"(worst {100 * min(h):.1f}%); time-weighted first {100 * w[0] / w[1]:.1f}%")
        print("  best times held by algorithm id: " +
              ", ".join(f"{a}: {n}" for a, n in wins.most_common()))
        # With a catalog (gemm_bench --catalog): the model's pick, its predicted time, its speed.
        picks, errors, selection = [], [], []
        for r, c in timed:
            best = min(x["us"] for x in c)
            pick = [x for x in c if x.get("model_rank") == 0]
            if pick:
                picks.append(best / pick[0]["us"])
                if "predicted_us" in pick[0]:
                    errors.append(pick[0]["predicted_us"] / pick[0]["us"])
            if "selection_us" in r:
                selection.append(r["selection_us"])
        if picks:
            err = math.exp(sum(abs(math.log(e)) for e in errors) / len(errors)) - 1 if errors else float("nan")
            print(f"  the model's pick: {100 * geomean(picks):.1f}% of the best timed (worst "
                  f"{100 * min(picks):.1f}%) on {len(picks)} problems; predicted time off by "
                  f"{100 * err:.1f}% (geomean); selection {median(selection):.1f} us median, "
                  f"{max(selection):.1f} largest")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    report([r for p in sys.argv[1:] for r in load(p)])
