#!/usr/bin/env python3
"""Writes DLRM model specs that are not in the zoo, drawn at random from the ranges production
recommenders span, so that bench/zoo-check.sh can ask how far the engine runs from its plan on
shapes nobody tuned it for.

    bench/novel_models.py --seed 7 --count 12 --out DIR     # DIR/novel-7-00.yaml ...

The same seed writes the same files. Each draw picks the interaction (dot or DCNv2), the table
groups (rows 1e3 to 2e7, log-uniform; one-hot or multi-hot bags up to 200 ids, sum or mean;
uniform or Zipf ids), dimensions that need not be powers of two, MLP widths that need not be
multiples of 8, the batch and the optimizers; every recipe lets the planner choose the table and
dense precisions as the zoo's do. Standard library only.
"""
import argparse
import math
import os
import random
import sys

DIMS = [16, 24, 32, 48, 64, 96, 128, 256]
WIDTHS = [64, 100, 128, 200, 256, 384, 500, 512, 768, 1000, 1024, 2048]
BATCHES = [2048, 8192, 16384, 32768, 65536, 131072]
# Rates that train the draws rather than diverge: sum-pooled bags of a hundred Zipf ids give hot
# rows gradients thousands of times larger than one example's, and Adagrad's first dense step is
# the full rate on every weight.
EMBEDDING_LR = {"rowwise_adagrad": 0.01, "adagrad": 0.01, "sgd": 0.005}
DENSE_LR = {"adam": 0.001, "adagrad": 0.001, "sgd": 0.01}


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def mlp(rng, layers, last):
    widths = sorted(rng.sample(WIDTHS, layers), reverse=True)
    return widths + [last]


def draw(rng, name):
    dot = rng.random() < 0.4
    dim = rng.choice(DIMS)
    groups = []
    n_tables = 0
    for g in range(rng.randint(1, 8)):
        count = rng.choice([1, 1, 1, 2, 4, 8, 16, 26])
        table = {"name": f"t{g}", "rows": log_uniform(rng, 1_000, 20_000_000)}
        if count > 1:
            table["count"] = count
        if not dot and rng.random() < 0.3:
            table["dim"] = rng.choice(DIMS)
        if rng.random() < 0.4:
            table["pooling_size"] = log_uniform(rng, 2, 200)
            if rng.random() < 0.3:
                table["pooling"] = "mean"
        if rng.random() < 0.5:
            table["distribution"] = "zipf"
            table["zipf_alpha"] = round(rng.uniform(1.0, 1.3), 2)
        groups.append(table)
        n_tables += count
    bottom = mlp(rng, rng.randint(1, 3), dim) if dot else mlp(rng, rng.randint(1, 3), rng.choice(DIMS))
    top = mlp(rng, rng.randint(1, 4), 1)
    if dot:
        interaction = "{kind: dot}"
    else:
        interaction = (f"{{kind: dcnv2, cross_layers: {rng.randint(1, 4)}, "
                       f"low_rank: {rng.choice([32, 64, 128, 256, 512])}}}")
    embedding_opt = rng.choice(["rowwise_adagrad", "adagrad", "sgd"])
    dense_opt = rng.choice(["adam", "adagrad", "sgd"])
    lines = [
        f"# Drawn by bench/novel_models.py ({name}): not a zoo model.",
        f"name: {name}",
        f"dense_features: {log_uniform(rng, 1, 512)}",
        f"batch_size: {rng.choice(BATCHES)}",
        f"table_defaults: {{dim: {dim}}}",
        "tables:",
    ]
    for t in groups:
        fields = ", ".join(f"{k}: {v}" for k, v in t.items())
        lines.append(f"  - {{{fields}}}")
    lines += [
        f"bottom_mlp: [{', '.join(map(str, bottom))}]",
        f"top_mlp: [{', '.join(map(str, top))}]",
        f"interaction: {interaction}",
        "optimizer:",
        f"  embedding: {{kind: {embedding_opt}, lr: {EMBEDDING_LR[embedding_opt]}}}",
        f"  dense: {{kind: {dense_opt}, lr: {DENSE_LR[dense_opt]}}}",
        "recipe:",
        "  allow_rowwise_adagrad: true",
        "  table_dtypes: [fp32, fp16, bf16]",
        "  dense_math: [fp32, tf32, bf16]",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--out", required=True, help="folder to write the specs into")
    args = ap.parse_args()
    if args.count < 1:
        sys.exit("novel_models.py: --count must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    for i in range(args.count):
        name = f"novel-{args.seed}-{i:02d}"
        with open(os.path.join(args.out, name + ".yaml"), "w") as f:
            f.write(draw(rng, name))
        print(os.path.join(args.out, name + ".yaml"))


if __name__ == "__main__":
    main()
