#!/usr/bin/env python3
"""PyTorch's nn.EmbeddingBag on exactly the inputs embedding_bench used (side-by-side peer).

embedding_bench --dump DIR writes each case's ids and offsets (the CSR of parity's
SparseInput) and its table shapes; this script rebuilds the same tables as nn.EmbeddingBag
(fp32, mode='sum', on the GPU), times forward and forward+backward (no optimizer) with CUDA events
(median of --reps after --warmup), for sparse=False and sparse=True where the dense gradient fits,
and prints, last, a table of parity next to PyTorch: GB/s, % of the measured copy bandwidth, and
the ratio of forward + backward times (parity's backward includes its fused optimizer update;
PyTorch's has no optimizer at all).

Usage: python3 bench/embedding_torch.py --dump DIR --parity parity.json [--out torch.json]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from torch_timing import median_ms


def load_case(dump, name):
    with open(os.path.join(dump, name + ".json")) as f:
        meta = json.load(f)
    rotations = []
    r = 0
    while os.path.exists(os.path.join(dump, f"{name}.ids.{r}.bin")):
        ids = np.fromfile(os.path.join(dump, f"{name}.ids.{r}.bin"), dtype=np.int64)
        offsets = np.fromfile(os.path.join(dump, f"{name}.offsets.{r}.bin"), dtype=np.int64)
        rotations.append((ids, offsets))
        r += 1
    return meta, rotations


def run_case(meta, rotations, sparse, warmup, reps):
    """Times PyTorch on one case; returns (forward ms, forward+backward ms) or None if it cannot fit."""
    B, D, T = meta["batch"], meta["dim"], len(meta["rows"])
    dev = torch.device("cuda")
    bags = []
    for t, rows in enumerate(meta["rows"]):
        bag = torch.nn.EmbeddingBag(rows, D, mode="sum", sparse=sparse, device=dev)
        with torch.no_grad():
            bag.weight.uniform_(-0.05, 0.05)
        bags.append(bag)
    # Per rotation and table: ids and offsets of that table's B bags (offsets relative to its ids).
    inputs = []
    for ids, offsets in rotations:
        per_table = []
        for t in range(T):
            lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
            tid = torch.from_numpy(ids[lo:hi].copy()).to(dev)
            toff = torch.from_numpy((offsets[t * B:(t + 1) * B] - lo).copy()).to(dev)
            per_table.append((tid, toff))
        inputs.append(per_table)
    grads = [torch.empty(B, D, device=dev).uniform_(-1, 1) for _ in range(len(rotations))]
    params = [b.weight for b in bags]

    def forward(i):
        with torch.no_grad():
            for t in range(T):
                tid, toff = inputs[i % len(inputs)][t]
                bags[t](tid, toff)

    def forward_backward(i):
        outs = []
        for t in range(T):
            tid, toff = inputs[i % len(inputs)][t]
            outs.append(bags[t](tid, toff))
        g = grads[i % len(grads)]
        # The gradient of every table's weight, returned (not accumulated into .grad): the cost
        # of PyTorch's backward itself, no optimizer.
        torch.autograd.grad(outs, params, grad_outputs=[g] * T)

    fwd = median_ms(forward, warmup, reps)
    fwdbwd = median_ms(forward_backward, warmup, reps)
    del bags, params, inputs, grads
    torch.cuda.empty_cache()
    return fwd, fwdbwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--parity", required=True, help="embedding_bench --results file")
    ap.add_argument("--out", default="")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cases", default="single,zipf,mlperf")
    args = ap.parse_args()

    with open(args.parity) as f:
        parity = json.load(f)
    copy = parity["copy_gbps"]
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}; parity's measured copy: {copy:.0f} GB/s")
    sys.stdout.flush()

    def parity_row(tag, pass_):
        for r in parity["results"]:
            if r.get("tag") == tag and r["pass"] == pass_:
                return r
        return None

    rows = []
    torch_out = {}
    for case in args.cases.split(","):
        if not os.path.exists(os.path.join(args.dump, case + ".json")):
            print(f"{case}: no dump, skipped")
            continue
        meta, rotations = load_case(args.dump, case)
        pf, pb = parity_row(case, "forward"), parity_row(case, "backward")
        if pf is None or pb is None:
            print(f"{case}: parity results missing, skipped")
            continue
        weight_bytes = sum(meta["rows"]) * meta["dim"] * 4
        free, _ = torch.cuda.mem_get_info()
        results = {}
        for sparse in (False, True):
            if not sparse and 2.2 * weight_bytes > free:
                print(f"{case}: sparse=False needs a dense gradient as large as the tables "
                      f"({weight_bytes / 1e9:.0f} GB): does not fit, skipped")
                continue
            t0 = time.time()
            try:
                fwd, fb = run_case(meta, rotations, sparse, args.warmup, args.reps)
            except torch.OutOfMemoryError as e:
                print(f"{case}: sparse={sparse}: out of memory ({e}); skipped")
                torch.cuda.empty_cache()
                continue
            results[sparse] = (fwd, fb)
            print(f"{case}: PyTorch sparse={sparse}: forward {fwd:.3f} ms, forward+backward {fb:.3f} ms "
                  f"(backward {fb - fwd:.3f} ms)  [{time.time() - t0:.0f} s]")
            sys.stdout.flush()
        if not results:
            continue
        torch_out[case] = {str(k): {"forward_ms": v[0], "forward_backward_ms": v[1]} for k, v in results.items()}
        best = min(results.items(), key=lambda kv: kv[1][1])
        rows.append((case, pf, pb, results, best))

    if args.out:
        with open(args.out, "w") as f:
            json.dump(torch_out, f, indent=1)

    print()
    print(f"== parity vs PyTorch nn.EmbeddingBag (fp32, dim 128, same ids), copy bandwidth {copy:.0f} GB/s ==")
    print("speed-up = PyTorch time / parity time; parity's backward includes its fused rowwise-Adagrad update,")
    print("PyTorch's backward only computes the gradient (sparse=False: dense, the default; sparse=True: unsorted COO)")
    print(f"{'case':8} {'pass':30} {'parity ms':>10} {'GB/s':>8} {'% copy':>7} {'torch ms':>10} {'torch GB/s':>10} {'speed-up':>9}")
    for case, pf, pb, results, best in rows:
        sparse, (tf, tfb) = best
        for label, p, tms in (("forward", pf, tf), ("backward+rowwise", pb, tfb - tf)):
            tgbps = p["bytes"] / (tms * 1e-3) / 1e9 if label == "forward" else float("nan")
            print(f"{case:8} {label:30} {p['ms']:10.3f} {p['gbps']:8.0f} {100 * p['gbps'] / copy:6.1f}% {tms:10.3f} "
                  f"{tgbps:10.0f} {tms / p['ms']:8.1f}x")
        tot = pf["ms"] + pb["ms"]
        print(f"{case:8} {'fwd+bwd (torch sparse=' + str(sparse) + ')':30} {tot:10.3f} {'':8} {'':7} {tfb:10.3f} {'':10} "
              f"{tfb / tot:8.1f}x")
        for s, (f_, fb_) in results.items():
            if s != sparse:
                print(f"{case:8} {'fwd+bwd (torch sparse=' + str(s) + ')':30} {'':10} {'':8} {'':7} {fb_:10.3f} {'':10} {fb_ / tot:8.1f}x")


if __name__ == "__main__":
    main()
