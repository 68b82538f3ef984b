#!/usr/bin/env python3
"""The fleet report: what the planner predicts for the zoo on MI350X against B200, ported and
co-designed (the planner only: no GPU needed).

For each model of the seed-like zoo (configs/models/seed-*.yaml; --zoo all for every
production-like model), at the GPU count its YAML names (gpus:; --gpus to override), `parity plan`
on B200 (its own recipe), on MI350X (co-designed) and
`--port-from b200` (the B200 recipe run unchanged on MI350X): the MI350X/B200 ratio per GPU of
the port and of the co-designed recipe, the gain of co-design over the port, and the step terms
that decide the ratio (the categories whose predicted time differs most between the two
devices' own plans). Writes fleet.md (a table and the geomeans) and fleet.svg (the ratios as
bars) into --out.

    python3 bench/fleet_report.py --parity build/parity --out out/fleet
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

def zoo(configs, which):
    names = sorted(f[:-5] for f in os.listdir(os.path.join(configs, "models")) if f.endswith(".yaml"))
    if which == "seed":
        return [n for n in names if n.startswith("seed-")]
    # The CPU-test models are not production-like.
    return [n for n in names if not n.startswith("tiny") and n not in ("criteo-small", "hstu-tiny")]


def run(parity, args):
    r = subprocess.run([parity] + args, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def per_gpu(text, which):
    """examples/s per GPU from `parity plan --port-from`: which 0 = port, 1 = co-designed."""
    num = r"([0-9.]+(?:e[+-]?[0-9]+)?)([kM]?)"
    m = re.search(r"examples/s per GPU +" + num + " +" + num, text)
    if not m:
        return None
    v, unit = m.group(1 + 2 * which), m.group(2 + 2 * which)
    return float(v) * {"": 1, "k": 1e3, "M": 1e6}[unit]


def best_count(parity, model, dev, gpus, out):
    """Each power-of-two GPU count up to `gpus` at the recipe's batch range (fewer, fuller GPUs):
    (the count with the most examples/s per GPU, that rate, the fewest count that fits). A count
    whose plan drops below the recipe's batches does not count."""
    text = open(model).read()
    ref = int(re.search(r"^batch_size:\s*([0-9]+)", text, re.M).group(1))
    m = re.search(r"^\s*min_global_batch:\s*([0-9]+)", text, re.M)
    floor = min(int(m.group(1)), ref) if m else ref
    best, fewest, w = None, None, 1
    while w <= gpus:
        f = os.path.join(out, f"{os.path.basename(model)[:-5]}.{dev}.{w}.json")
        rc, _ = run(parity, ["plan", "--model", model, "--device", dev, "--gpus", str(w), "--out", f])
        if rc == 0:
            p = json.load(open(f))
            if p["global_batch"] >= max(w, floor // w * w):
                rate = p["prediction"]["examples_per_s_per_gpu"]
                fewest = fewest or w
                if best is None or rate > best[1]:
                    best = (w, rate)
        w *= 2
    return (best[0], best[1], fewest) if best else None


def deciding_terms(b200, mi350x, n=3):
    """The categories whose predicted time differs most between the two plans, in ms."""
    cats = set(b200["prediction"]["time_s"]) | set(mi350x["prediction"]["time_s"])
    diffs = []
    for c in cats:
        a = b200["prediction"]["time_s"].get(c, 0.0)
        b = mi350x["prediction"]["time_s"].get(c, 0.0)
        diffs.append((abs(b - a), c, a, b))
    diffs.sort(reverse=True)
    return "; ".join(f"{c} {a * 1e3:.2f} -> {b * 1e3:.2f} ms" for d, c, a, b in diffs[:n] if d > 0)


def svg(rows, path):
    """Grouped bars: MI350X/B200 per GPU, port and co-designed, with a line at parity."""
    w, bar, gap, top, left = 900, 12, 14, 40, 210
    height = top + len(rows) * (2 * bar + gap) + 50
    scale = (w - left - 40) / max(2.0, max(max(r["port"], r["codesign"]) for r in rows) * 1.1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="20" font-size="14">Predicted MI350X / B200 examples/s per GPU '
           '(1.0 = parity)</text>']
    y = top
    for r in rows:
        out.append(f'<text x="{left - 8}" y="{y + bar + 4}" text-anchor="end">{r["model"]}</text>')
        for k, colour in (("port", "#b0b0b0"), ("codesign", "#c0392b")):
            out.append(f'<rect x="{left}" y="{y}" width="{r[k] * scale:.1f}" height="{bar}" '
                       f'fill="{colour}"/>')
            out.append(f'<text x="{left + r[k] * scale + 4:.1f}" y="{y + bar - 2}">{r[k]:.2f}</text>')
            y += bar
        y += gap
    x1 = left + scale
    out.append(f'<line x1="{x1:.1f}" y1="{top - 6}" x2="{x1:.1f}" y2="{y}" stroke="black" '
               'stroke-dasharray="4 3"/>')
    out.append(f'<rect x="{left}" y="{y + 14}" width="12" height="12" fill="#b0b0b0"/>'
               f'<text x="{left + 18}" y="{y + 24}">direct port of the B200 recipe</text>')
    out.append(f'<rect x="{left + 230}" y="{y + 14}" width="12" height="12" fill="#c0392b"/>'
               f'<text x="{left + 248}" y="{y + 24}">co-designed for MI350X</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parity", default="build/parity")
    ap.add_argument("--configs", default="configs")
    ap.add_argument("--out", default="out/fleet")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--zoo", choices=("seed", "all"), default="seed")
    ap.add_argument("--gpus", type=int, help="GPU count for every model (default: each model's gpus:)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, skipped = [], []
    gpus_arg = ["--gpus", str(a.gpus)] if a.gpus else []
    for m in a.models or zoo(a.configs, a.zoo):
        model = os.path.join(a.configs, "models", m + ".yaml")
        plans = {}
        for dev in ("b200", "mi350x"):
            f = os.path.join(a.out, f"{m}.{dev}.json")
            rc, text = run(a.parity, ["plan", "--model", model, "--device", dev, "--out", f] + gpus_arg)
            if rc != 0:
                skipped.append((m, dev, text.strip().splitlines()[-1][:160]))
                break
            plans[dev] = json.load(open(f))
        if len(plans) < 2:
            continue
        rc, text = run(a.parity, ["plan", "--model", model, "--device", "mi350x", "--port-from", "b200"]
                       + gpus_arg)
        port, codesign = per_gpu(text, 0), per_gpu(text, 1)
        if rc != 0 or port is None:
            skipped.append((m, "port", text.strip().splitlines()[-1][:160]))
            continue
        gpus = plans["b200"]["gpus"]
        b200 = plans["b200"]["prediction"]["examples_per_s_per_gpu"]
        counts = {d: best_count(a.parity, model, d, gpus, a.out) for d in ("b200", "mi350x")}
        hstu = re.search(r"^kind:\s*hstu\b", open(model).read(), re.M) is not None
        rows.append({"model": m, "gpus": gpus, "hstu": hstu, "port": port / b200, "codesign": codesign / b200,
                     "gain": codesign / port, "terms": deciding_terms(plans["b200"], plans["mi350x"]),
                     "b200": b200, "mi350x": codesign, "counts": counts,
                     "by_count": counts["mi350x"][1] / counts["b200"][1]
                     if counts["b200"] and counts["mi350x"] else None})
    if not rows:
        sys.exit("fleet_report: no model planned")
    def geomean(rs):
        return {k: math.exp(sum(math.log(r[k]) for r in rs) / len(rs)) for k in ("port", "codesign", "gain")}
    geo = geomean(rows)
    dlrm = [r for r in rows if not r["hstu"]]
    with open(os.path.join(a.out, "fleet.md"), "w") as f:
        f.write("| model | GPUs | B200 examples/s per GPU | MI350X co-designed | MI350X/B200, port | "
                "MI350X/B200, co-designed | co-design over port | fewest GPUs that fit, B200 / MI350X | "
                "best examples/s per GPU over GPU counts, MI350X/B200 | "
                "terms that decide it (B200 -> MI350X, own plans) |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            c = r["counts"]
            fewest = " / ".join(str(c[d][2]) if c[d] else "-" for d in ("b200", "mi350x"))
            by_count = (f"{r['by_count']:.2f} ({c['b200'][0]} / {c['mi350x'][0]} GPUs)"
                        if r["by_count"] else "-")
            f.write(f"| {r['model']} | {r['gpus']} | {r['b200']:.4g} | {r['mi350x']:.4g} | "
                    f"{r['port']:.2f} | {r['codesign']:.2f} | {r['gain']:.2f}x | {fewest} | {by_count} | "
                    f"{r['terms']} |\n")
        def count_geo(rs):
            v = [r["by_count"] for r in rs if r["by_count"]]
            return f"{math.exp(sum(math.log(x) for x in v) / len(v)):.2f}" if v else "-"
        f.write(f"| **geomean** ({len(rows)} models) | | | | **{geo['port']:.2f}** | "
                f"**{geo['codesign']:.2f}** | **{geo['gain']:.2f}x** | | **{count_geo(rows)}** | |\n")
        if dlrm and len(dlrm) < len(rows):
            g = geomean(dlrm)
            f.write(f"| geomean, DLRM models ({len(dlrm)}) | | | | {g['port']:.2f} | {g['codesign']:.2f} | "
                    f"{g['gain']:.2f}x | | {count_geo(dlrm)} | |\n")
        if skipped:
            f.write("\nNot planned:\n")
            for m, dev, why in skipped:
                f.write(f"- {m} ({dev}): {why}\n")
    svg(rows, os.path.join(a.out, "fleet.svg"))
    print(open(os.path.join(a.out, "fleet.md")).read())


if __name__ == "__main__":
    main()
