#!/usr/bin/env python3
"""PyTorch's numerics on parity's data: bench/dlrm_torch.py's model trained on a parity shard
dataset in order, its mean loss per window written as `parity train --loss-log` writes it.

Why it is built this way: bench/numerics-check.sh bounds parity's bf16 run against its fp32 run
(0.3% in every window of 100 steps). How far bf16 moves a run is a property of the model, its
data and bf16's rounding as much as of parity's kernels. The field's standard mixed precision,
torch.autocast to bf16, trained on the same examples in the same order, says which. And
--perturb-ulp moves every weight by about an ulp before the first step, the size of the
difference two devices' orders of summation make, to measure how far the model itself carries
so small a change. The model, its initialisation rules and its optimizers are dlrm_torch.py's
(parity's formulas); the weights' random numbers are PyTorch's, so a run tracks parity's only as
closely as two initialisations do. bf16 here is autocast: bf16 operands and outputs for the
products, fp32 elsewhere, with fp32 accumulation (reduced-precision reductions off, as parity's
bf16 products accumulate).

Usage:
  parity data synth --model tiny --examples 1024000 --eval-examples 65536 --seed 1 --out DIR
  python3 bench/numerics_torch.py --model configs/models/tiny.yaml --data DIR --dense-math bf16 \\
      [--steps 2000] [--batch 512] [--seed 1] [--loss-log FILE] [--loss-window 100] \\
      [--eval-examples 65536] [--perturb-ulp 1]
The dataset's splits are read whole into memory (a numerics run's data is small). With --steps
beyond one pass the training split repeats from its first example, as `parity train` repeats it,
where the split holds whole batches (else refused). Prints the final window and `AUC x`
(held-out, the first --eval-examples of the eval split) last.
"""
import argparse
import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dlrm_torch import build, read_spec  # noqa: E402

HEADER = struct.Struct("<8sIIqiiqII16x")  # src/data/shards.cpp: the part file's 64-byte header
assert HEADER.size == 64


def up8(n):
    return (n + 7) // 8 * 8


def read_meta(data):
    meta_path = Path(data) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"{meta_path}: not a parity shard dataset's description ({e})")
    if not isinstance(meta, dict) or meta.get("format") != "parity-shards-1":
        sys.exit(f"{meta_path}: format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                 "expected 'parity-shards-1'")
    return meta_path, meta


def split_of(meta_path, meta, split):
    s = (meta.get("splits") or {}).get(split)
    if not isinstance(s, dict) or not isinstance(s.get("files"), list) or not isinstance(s.get("examples"), int):
        sys.exit(f"{meta_path}: splits.{split} with its files and examples expected")
    return s


def read_split(torch, data, split, tables, dense_features, limit):
    """One split of a parity shard dataset (docs/data.md), its first `limit` examples (0: all):
    labels [n], dense [n, F], and per table its ids in example order with each example's
    count."""
    meta_path, meta = read_meta(data)
    T = len(tables)
    rows = [t["rows"] for t in meta.get("tables", [])]
    if meta.get("dense_features") != dense_features or rows != [t["rows"] for t in tables]:
        sys.exit(f"{meta_path}: {meta.get('dense_features')} dense features and tables of {rows} rows; "
                 f"the model has {dense_features} and {[t['rows'] for t in tables]}")
    files = split_of(meta_path, meta, split)["files"]
    labels, dense, ids, lens, total = [], [], [[] for _ in range(T)], [[] for _ in range(T)], 0
    for f in files:
        if limit and total >= limit:
            break
        path = Path(data) / f["file"]
        raw = bytearray(path.read_bytes())
        if len(raw) < HEADER.size:
            sys.exit(f"{path}: {len(raw)} bytes, shorter than a part file's {HEADER.size}-byte header")
        magic, version, id_bytes, n, nf, nt, nids, has_teacher, _ = HEADER.unpack_from(raw)
        if magic != b"PRTYSHD1" or version != 1 or id_bytes not in (4, 8) or has_teacher > 1:
            sys.exit(f"{path}: not a parity part file of version 1 (magic {magic!r}, version {version})")
        if nf != dense_features or nt != T:
            sys.exit(f"{path}: {nf} dense features and {nt} tables, the model has {dense_features} and {T}")
        if n < 1 or nids < 0:
            sys.exit(f"{path}: header says {n} examples and {nids} ids")
        ids_at = up8(up8(up8(HEADER.size + 4 * n) + 4 * n * has_teacher) + 4 * n * nf) + up8(8 * T * (n + 1))
        if ids_at + nids * id_bytes != len(raw):
            sys.exit(f"{path}: {len(raw)} bytes, its header implies {ids_at + nids * id_bytes}")
        at = HEADER.size

        def take(dtype, count, size):
            nonlocal at
            t = torch.frombuffer(raw, dtype=dtype, count=count, offset=at) if count else torch.empty(0, dtype=dtype)
            at = up8(at + count * size)
            return t

        lab = take(torch.float32, n, 4)
        if has_teacher:
            take(torch.float32, n, 4)
        den = take(torch.float32, n * nf, 4).view(n, nf)
        off = take(torch.int64, T * (n + 1), 8).view(T, n + 1)
        all_ids = take(torch.int32 if id_bytes == 4 else torch.int64, nids, id_bytes)
        flat = off.reshape(-1)
        if int(flat[0]) != 0 or int(flat[-1]) != nids or bool((flat[1:] < flat[:-1]).any()) or \
                bool((off[1:, 0] != off[:-1, -1]).any()):
            sys.exit(f"{path}: the ids' offsets are not monotone from 0 to {nids}, table after table")
        keep = min(n, limit - total) if limit else n
        labels.append(lab[:keep].clone())
        dense.append(den[:keep].clone())
        for t in range(T):
            lo, hi = int(off[t][0]), int(off[t][keep])
            # u32 ids read as int32 are exact below 2^31 rows, which a numerics run's tables are
            ids[t].append(all_ids[lo:hi].long())
            lens[t].append(off[t][1:keep + 1] - off[t][:keep])
        total += keep
    if limit and total < limit:
        sys.exit(f"{data}: the {split} split has {total} examples, {limit} asked for")
    for t, tb in enumerate(tables):
        i = torch.cat(ids[t])
        if len(i) and (int(i.min()) < 0 or int(i.max()) >= tb["rows"]):
            sys.exit(f"{data}: table {tb['name']} has ids outside [0, {tb['rows']})")
        ln = torch.cat(lens[t])
        if tb["pooling"] == "mean" and bool((ln != tb["pooling_size"]).any()):
            sys.exit(f"{data}: mean-pooled table {tb['name']} needs {tb['pooling_size']} ids per example")
    return dict(labels=torch.cat(labels), dense=torch.cat(dense), ids=[torch.cat(i) for i in ids],
                lens=[torch.cat(x) for x in lens], n=total)


class Batches:
    """Examples [e, e + B) of a split as bench/dlrm_torch.py's build() takes them, on `dev`."""

    def __init__(self, torch, split, tables, fused, dev):
        self.torch, self.tables, self.fused, self.dev = torch, tables, fused, dev
        self.labels, self.dense = split["labels"].to(dev), split["dense"].to(dev)
        self.ids = [i.to(dev) for i in split["ids"]]
        self.lens = [x.to(dev) for x in split["lens"]]
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        self.starts = [torch.cat([zero, x.cumsum(0)]) for x in self.lens]  # [n + 1] per table
        self.n = split["n"]

    def get(self, e, B):
        torch = self.torch
        ids, offs = [], []
        for t, tb in enumerate(self.tables):
            lo, hi = int(self.starts[t][e]), int(self.starts[t][e + B])
            ids.append(self.ids[t][lo:hi] + tb["base"])
            offs.append(self.lens[t][e:e + B])
        zero = torch.zeros(1, dtype=torch.long, device=self.dev)
        if self.fused:  # one bag over every table, table-major
            ids, offs = [torch.cat(ids)], [torch.cat([zero, torch.cat(offs).cumsum(0)])]
        else:
            offs = [torch.cat([zero, o.cumsum(0)]) for o in offs]
        return self.dense[e:e + B], ids, offs, self.labels[e:e + B]


def roc_auc(torch, scores, labels):
    """Area under the ROC curve, ties counted half (the Mann-Whitney statistic)."""
    s, order = scores.double().sort()
    y = labels.double()[order]
    _, inverse, counts = torch.unique_consecutive(s, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]  # mean 1-based rank of each tie group
    pos = float(y.sum())
    neg = len(y) - pos
    return (float((ranks * y).sum()) - pos * (pos + 1) / 2) / (pos * neg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model YAML (a DLRM model of configs/models)")
    ap.add_argument("--data", required=True, help="a parity shard dataset (parity data synth)")
    ap.add_argument("--dense-math", choices=["fp32", "tf32", "bf16"], default="fp32")
    ap.add_argument("--steps", type=int, default=0, help="default: one pass over the training split")
    ap.add_argument("--batch", type=int, default=0, help="default: the YAML's batch_size")
    ap.add_argument("--seed", type=int, default=1, help="PyTorch's initialisation")
    ap.add_argument("--rows-cap", type=int, default=0, help="as the dataset was written with (0: none)")
    ap.add_argument("--loss-log", default=None)
    ap.add_argument("--loss-window", type=int, default=100)
    ap.add_argument("--eval-examples", type=int, default=65536)
    ap.add_argument("--perturb-ulp", type=float, default=0.0,
                    help="before the first step, scale every weight by the fp32 number nearest "
                         "1 + u N 2^-23, u uniform in (-1, 1): about N ulps, the size of the "
                         "difference two devices' orders of summation make")
    args = ap.parse_args(argv)
    if args.steps < 0 or args.batch < 0 or args.loss_window < 1 or args.eval_examples < 1:
        ap.error("--steps and --batch must be >= 0, --loss-window and --eval-examples >= 1")
    spec, tables = read_spec(args.model, args.rows_cap)
    B = args.batch or int(spec["batch_size"])
    args.compile, args.compile_mode, args.embedding_optimizer = False, None, "rowwise_adagrad"
    if spec["optimizer"]["embedding"]["kind"] != "rowwise_adagrad":
        sys.exit(f"{args.model}: tables' optimizer {spec['optimizer']['embedding']['kind']}; "
                 "this peer trains rowwise_adagrad tables only")

    meta_path, meta = read_meta(args.data)
    n_train = split_of(meta_path, meta, "train")["examples"]
    n_eval = split_of(meta_path, meta, "eval")["examples"]
    if n_train < B:
        sys.exit(f"{meta_path}: {n_train} training examples, fewer than one batch of {B}")
    if args.steps * B > n_train and n_train % B:
        sys.exit(f"{meta_path}: {args.steps} steps of {B} go past the {n_train} training examples, which are "
                 f"not whole batches; write a multiple of {B} (parity train fills the batch across the end)")
    if n_eval < args.eval_examples:
        sys.exit(f"{meta_path}: the eval split has {n_eval} examples, --eval-examples {args.eval_examples} asked for")

    import torch
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = args.dense_math == "tf32"
    try:  # fp32 sums inside bf16 products, as parity's (the switch is new in torch 1.12)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    except (AttributeError, AssertionError):
        pass
    torch.manual_seed(args.seed)
    m = build(torch, args, spec, tables, dev)
    if args.perturb_ulp:
        gen = torch.Generator(device=dev).manual_seed(args.seed + 7)
        with torch.no_grad():
            for p in list(m.dense_mod.parameters()) + m.weights:
                u = torch.rand(p.shape, generator=gen, device=dev) * 2 - 1
                p.mul_(1 + u * (args.perturb_ulp * 2.0**-23))

    nf = int(spec["dense_features"])
    train = read_split(torch, args.data, "train", tables, nf, 0)
    steps = args.steps or train["n"] // B
    data = Batches(torch, train, tables, m.fused, dev)
    losses = []
    e = 0
    for _ in range(steps):
        if e + B > data.n:  # another pass (whole batches: checked above)
            e = 0
        dense, ids, offs, labels = data.get(e, B)
        losses.append(m.step(dense, m.embed(ids, offs), labels))
        e += B
    losses = torch.stack(losses).double().cpu()
    if not bool(torch.isfinite(losses).all()):
        sys.exit(f"the loss is not finite from step {int((~torch.isfinite(losses)).nonzero()[0]) + 1}")
    w = args.loss_window
    windows = [(k + w, float(losses[k:k + w].mean())) for k in range(0, steps - w + 1, w)]
    if args.loss_log:
        text = f"# mean training loss over windows of {w} steps: last step, mean\n"
        text += "".join(f"{s} {v:.9g}\n" for s, v in windows)
        Path(args.loss_log).write_text(text)

    held = Batches(torch, read_split(torch, args.data, "eval", tables, nf, args.eval_examples), tables,
                   m.fused, dev)
    scores = []
    with torch.no_grad():
        for e in range(0, held.n, B):
            n = min(B, held.n - e)
            dense, ids, offs, labels = held.get(e, n)
            scores.append(logits(torch, m, dense, m.embed(ids, offs), args.dense_math, dev))
    auc = roc_auc(torch, torch.cat(scores).cpu(), held.labels.cpu())
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    last = f"last window (steps {windows[-1][0] - w + 1}-{windows[-1][0]}) {windows[-1][1]:.4f}, " if windows else ""
    off = f" (weights {args.perturb_ulp:g} ulp off)" if args.perturb_ulp else ""
    print(f"{spec['name']}: {steps} steps, batch {B}, dense {args.dense_math}{off}, seed {args.seed}; {last}"
          f"held-out examples {held.n}: AUC {auc:.4f} ({name}, torch {torch.__version__})", flush=True)
    return 0


def logits(torch, m, dense, pooled, dense_math, dev):
    """The model's logits: dlrm_torch's forward up to the loss, its last layer's output."""
    captured = []
    hook = m.dense_mod.top[-1].register_forward_hook(lambda mod, inp, out: captured.append(out))
    try:
        m.dense_fn(dense, pooled, torch.zeros(dense.shape[0], device=dev))
    finally:
        hook.remove()
    return captured[0].float().squeeze(1)


if __name__ == "__main__":
    sys.exit(main())
