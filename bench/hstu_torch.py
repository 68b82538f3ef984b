#!/usr/bin/env python3
"""PyTorch peer of parity's HSTU training step, from the same model YAML (kind: hstu).

Why it is built this way: to say what careful stock PyTorch reaches on the same GPU for the HSTU
model parity trains (the issue's whole-model comparison), so parity's examples/s has a peer. The
model is parity's engine (src/engine/hstu_model.cpp) in PyTorch ops. Example b's tokens are its C
contextual features, its L_b history events and its T targets. Per layer, on the jagged
[tokens, d] rows:

    n = LayerNorm(x; gamma, beta);  [U V Q K] = SiLU(n W^T + b)
    O_i = (1/N) sum_j visible SiLU(Q_i.K_j / sqrt(a) + rab(i, j)) V_j     (N = C + max_len + T)
    x = x + (LayerNorm(O) * U) W_o^T + b_o

with j visible from i when j <= i and (j is history or j == i), rab(i, j) = position[h, min(i -
j, P - 1)] + time[h, min(bit_width(t_i - t_j), T_b - 1)]; the targets' final tokens ->
LayerNorm -> linear head -> mean BCE over targets and tasks. Tables: summed per token (or
concatenated, `combine: concat`), one EmbeddingBag per table group with sparse gradients and the
rowwise Adagrad update parity fuses (hand-written, as bench/dlrm_torch.py's); dense: AdamW.

The attention is the padded dense formulation that PyTorch users write for HSTU (the scores
never are jagged in stock PyTorch), made as cheap as it can be without a custom kernel: the
sequences are sorted into length buckets (64 * 2^(k/2) tokens, so padding at most doubles the
pairs), each bucket padded to its length and cut into chunks of at most --chunk-pairs scores, and
each chunk's attention is one function (compiled with --compile). Its time buckets are
floor(log2(dt)) + 1 in float64, which is bit_width(dt) exactly for dt below 2^53.

The same as parity: shapes, math, parameter and optimizer kinds, batch, table dtype (--table-dtype,
the plan's), dense math. Not the same: the random numbers, the data (random ids; the history
lengths follow the YAML's law; log-uniform time gaps; Bernoulli(0.5) labels, not parity's planted
teacher), and the data path: --pool batches and their bucket layouts are made ON THE GPU before
timing and cycled, so PyTorch is never host-bound (parity's step copies its batch in).

Usage:
  python3 bench/hstu_torch.py --model configs/models/hstu-feed-1k.yaml [--batch N] [--rows-cap N]
      [--dense-math fp32|tf32|bf16] [--table-dtype fp32|fp16] [--compile] [--pool 4]
      [--warmup 10] [--steps 30] [--chunk-pairs 268435456] [--seed 0]
  python3 bench/hstu_torch.py --check      # hstu-tiny: the bucketed attention against a per-pair
                                           # loop, and one table update against its formula
Prints a human line and, last, `RESULT {json}`. Exit code 3: out of GPU memory at this batch.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dlrm_torch import load_yaml, zipf_ids, REPO  # noqa: E402


# ------------------------------------------------------------------ model spec ----
def read_spec(path, rows_cap):
    y = load_yaml(path)
    if y.get("kind") != "hstu":
        sys.exit(f"{path}: kind: hstu expected (bench/dlrm_torch.py runs the DLRM models)")
    seq, h = y["sequence"], y["hstu"]

    def table(e):
        t = dict(name=e["name"], rows=int(e["rows"]), dim=int(e["dim"]),
                 pooling_size=int(e.get("pooling_size", 1)),
                 distribution=e.get("distribution", "uniform"), zipf_alpha=float(e.get("zipf_alpha", 1.0)))
        t["rows"] = min(t["rows"], rows_cap) if rows_cap > 0 else t["rows"]
        return t

    features = [table(e) for e in seq["features"]]
    contexts = [table(e) for e in (y.get("context") or [])]
    for t in contexts:
        if t["dim"] != h["model_dim"]:
            sys.exit(f"{path}: context {t['name']} dim {t['dim']} != model_dim {h['model_dim']}")
    return y, seq, h, features, contexts


def history_lengths(seq, n, gen, dev, torch):
    """The YAML's length law, as parity's synthetic sequences draw it (src/data/sequences.cpp)."""
    lo, hi = float(seq.get("min_len", 1)), float(seq["max_len"]) + 1.0
    u = torch.rand(n, generator=gen, device=dev, dtype=torch.float64)
    x = lo + u * (hi - lo)
    if seq.get("lengths", "uniform") == "power_law":
        a = float(seq["length_alpha"])
        if abs(a - 1.0) < 1e-12:
            x = lo * torch.exp(u * math.log(hi / lo))
        else:
            l, h = lo ** (1 - a), hi ** (1 - a)
            x = (l + u * (h - l)) ** (1 / (1 - a))
    return x.floor().long().clamp_(int(lo), int(seq["max_len"]))


def bucket_sizes(n_max):
    """Padded lengths 64 * 2^(k/2), rounded up to 64, ending at n_max rounded up to 64."""
    top = -(-n_max // 64) * 64
    sizes, k = [], 0
    while True:
        s = -(-int(math.ceil(64 * 2 ** (k / 2))) // 64) * 64
        if s >= top:
            sizes.append(top)
            return sizes
        if not sizes or s > sizes[-1]:
            sizes.append(s)
        k += 1


# ------------------------------------------------------------------ the run ----
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model YAML (default hstu-feed-1k; hstu-tiny with --check)")
    ap.add_argument("--batch", type=int, default=0, help="default: the YAML's batch_size")
    ap.add_argument("--rows-cap", type=int, default=0, help="cap every table's rows (0: none)")
    ap.add_argument("--dense-math", choices=["fp32", "tf32", "bf16"], default="bf16")
    ap.add_argument("--table-dtype", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--compile", action="store_true", help="torch.compile the layers and the attention")
    ap.add_argument("--pool", type=int, default=4, help="distinct pre-generated batches")
    ap.add_argument("--warmup", type=int, default=None, help="default 10 (1 with --check)")
    ap.add_argument("--steps", type=int, default=None, help="default 30 (2 with --check)")
    ap.add_argument("--chunk-pairs", type=int, default=1 << 28, help="scores (batch x heads x n x n) per attention chunk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="after timing, the top CUDA kernels of 2 steps (torch.profiler)")
    ap.add_argument("--check", action="store_true", help="small correctness run (hstu-tiny; CPU if no GPU)")
    args = ap.parse_args(argv)
    args.model = args.model or str(REPO / "configs/models" / ("hstu-tiny.yaml" if args.check else "hstu-feed-1k.yaml"))
    args.warmup = args.warmup if args.warmup is not None else (1 if args.check else 10)
    args.steps = args.steps if args.steps is not None else (2 if args.check else 30)
    if args.steps < 1 or args.pool < 1 or args.chunk_pairs < 1:
        ap.error("--steps, --pool and --chunk-pairs must be >= 1")
    spec = read_spec(args.model, args.rows_cap)
    args.batch = args.batch or int(spec[0]["batch_size"])
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    try:
        return run(torch, args, *spec)
    except Exception as e:  # a compile-time OOM arrives wrapped; look down the chain
        c, depth = e, 0
        while c is not None and not (isinstance(c, OOM) or "out of memory" in str(c).lower()
                                     or "ALLOC_FAILED" in str(c)):
            c, depth = (c.__cause__ or c.__context__) if depth < 20 else None, depth + 1
        if c is None:
            raise
        print(f"DID NOT FIT: {spec[0]['name']} at batch {args.batch} (rows cap {args.rows_cap or 'none'}, "
              f"tables {args.table_dtype}): out of GPU memory ({str(c).splitlines()[0][:200]})", flush=True)
        return 3


def run(torch, args, y, seq, hs, features, contexts):
    nn, F = torch.nn, torch.nn.functional
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not args.check:
        sys.exit("no CUDA device (only --check runs on the CPU)")
    if args.dense_math == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(args.seed)
    B = args.batch
    d, H, A, V = (int(hs[k]) for k in ("model_dim", "heads", "attention_dim", "value_dim"))
    P, TB, layers = int(hs["position_buckets"]), int(hs["time_buckets"]), int(hs["layers"])
    C, T, L_max = len(contexts), int(seq["targets"]), int(seq["max_len"])
    tasks = len(y["tasks"])
    concat = seq.get("combine", "sum") == "concat"
    n_max = C + L_max + T
    inv_n = 1.0 / n_max
    hv, ha = H * V, H * A
    wdtype = torch.float16 if args.table_dtype == "fp16" else torch.float32
    if not concat and any(t["dim"] != d for t in features):
        sys.exit(f"{args.model}: combine: sum needs every feature dim == model_dim {d}")
    if concat and sum(t["dim"] for t in features) != d:
        sys.exit(f"{args.model}: combine: concat needs the feature dims to sum to model_dim {d}")

    # ---- tables: sum -> one weight for every table; concat -> one per feature (+ one for the
    # contexts). Each group has a row base per table and its bag per token.
    wgen = torch.Generator(device=dev).manual_seed(args.seed)
    groups = ([features + contexts] if not concat else [[t] for t in features] + ([contexts] if contexts else []))
    weights = []
    for g in groups:
        w = torch.empty(sum(t["rows"] for t in g), g[0]["dim"], device=dev, dtype=wdtype)
        base = 0
        for t in g:
            a = 1.0 / math.sqrt(t["rows"])
            for lo in range(0, t["rows"], 1 << 22):
                hi = min(lo + (1 << 22), t["rows"])
                w[base + lo:base + hi].uniform_(-a, a, generator=wgen)
            t["base"], base = base, base + t["rows"]
        weights.append(nn.Parameter(w))
    states = [torch.zeros(w.shape[0], device=dev) for w in weights]
    rows_total = sum(t["rows"] for t in features + contexts)
    emb_bytes = sum(w.numel() * w.element_size() for w in weights)
    print(f"{y['name']}: {len(features)} features + {len(contexts)} contexts, {rows_total:,} rows "
          f"({emb_bytes / 1e9:.1f} GB {args.table_dtype}), batch {B}, d {d}, {layers} layers, {H} heads "
          f"of a {A} / v {V}, tokens up to {n_max} an example", flush=True)

    # ---- dense parameters ----
    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_w = nn.ParameterList([nn.Parameter(torch.ones(d, device=dev)) for _ in range(layers)])
            self.ln_b = nn.ParameterList([nn.Parameter(torch.zeros(d, device=dev)) for _ in range(layers)])
            self.uvqk = nn.ModuleList([nn.Linear(d, 2 * hv + 2 * ha, device=dev) for _ in range(layers)])
            self.out = nn.ModuleList([nn.Linear(hv, d, device=dev) for _ in range(layers)])
            for m in list(self.uvqk) + list(self.out):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            self.pos = nn.ParameterList([nn.Parameter(0.01 * torch.randn(H, P, device=dev)) for _ in range(layers)])
            self.tim = nn.ParameterList([nn.Parameter(0.01 * torch.randn(H, TB, device=dev)) for _ in range(layers)])
            self.final = nn.LayerNorm(d, device=dev)
            self.head = nn.Linear(d, tasks, device=dev)
            nn.init.xavier_uniform_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    dense = Dense()
    bf16 = args.dense_math == "bf16"

    def pre(x, ln_w, ln_b, W, b):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            n = F.layer_norm(x, (d,), ln_w, ln_b, 1e-5)
            return F.silu(F.linear(n, W, b))

    def post(x, o, u, W, b):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            y_ = F.layer_norm(o.float(), (hv,), None, None, 1e-5) * u.float()
            return x + F.linear(y_, W, b).float()

    def attention(q, k, v, ts, hist, total, pos, tim):
        """One chunk: q, k [nb, N, H, A], v [nb, N, H, V], ts [nb, N], hist/total [nb]."""
        nb, N = q.shape[0], q.shape[1]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            s = torch.matmul(q.transpose(1, 2), k.permute(0, 2, 3, 1)) * (1.0 / math.sqrt(A))
            i = torch.arange(N, device=q.device).view(N, 1)
            j = torch.arange(N, device=q.device).view(1, N)
            rab_p = bucket_bias(pos, (i - j).clamp(0, P - 1))  # [H, N, N]
            dt = (ts.view(nb, N, 1) - ts.view(nb, 1, N)).clamp(min=0).double()  # exact below 2^53
            tb = torch.where(dt > 0, torch.floor(torch.log2(dt.clamp(min=1))) + 1, 0).clamp(max=TB - 1).long()
            rab_t = bucket_bias(tim, tb).permute(1, 0, 2, 3)  # [nb, H, N, N]
            ok = (j <= i) & ((j < hist.view(nb, 1, 1)) | (j == i)) & (i < total.view(nb, 1, 1))
            w = F.silu(s.float() + rab_p.unsqueeze(0) + rab_t) * (ok.unsqueeze(1) * inv_n)
            return torch.matmul(w.to(v.dtype) if bf16 else w, v.transpose(1, 2)).transpose(1, 2)  # [nb, N, H, V]

    class BucketGather(torch.autograd.Function):
        """table[:, idx] (table [H, K]) whose backward sums each bucket's gradient with bincount,
        a shared-memory histogram: index_put's atomics (eager and compiled) put hundreds of
        millions of adds on the K addresses of a head, and took 98% of the eager step."""

        @staticmethod
        def forward(ctx, table, idx):
            ctx.save_for_backward(idx)
            ctx.k = table.shape[1]
            return table[:, idx]

        @staticmethod
        def backward(ctx, g):
            (idx,) = ctx.saved_tensors
            flat = idx.reshape(-1)
            sums = [torch.bincount(flat, weights=g[h].reshape(-1).float(), minlength=ctx.k)[:ctx.k]
                    for h in range(g.shape[0])]
            return torch.stack(sums).to(g.dtype), None

    @torch.compiler.disable  # bincount's output size depends on the data: run it eagerly
    def bucket_bias(table, idx):
        return BucketGather.apply(table, idx)

    def head(xf, labels):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            logits = dense.head(dense.final(xf.float()))
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    if args.compile:
        pre, post, attention, head = (torch.compile(f, dynamic=True) for f in (pre, post, attention, head))

    # ---- data: --pool batches and their layouts, made on the device before timing ----
    dgen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    sizes = bucket_sizes(n_max)
    max_gap = 30 * 86400.0

    def draw(t, n):
        if t["distribution"] == "zipf":
            return zipf_ids(n, t["rows"], t["zipf_alpha"], dgen, dev, torch)
        return torch.randint(0, t["rows"], (n,), generator=dgen, device=dev)

    def make_batch():
        L = history_lengths(seq, B, dgen, dev, torch)
        n = C + L + T
        start = torch.zeros(B + 1, dtype=torch.long, device=dev)
        start[1:] = n.cumsum(0)
        tokens = int(start[-1])
        ex = torch.repeat_interleave(torch.arange(B, device=dev), n)  # example of each token
        pos_in = torch.arange(tokens, device=dev) - start[ex]  # position within its example
        kind = torch.where(pos_in < C, 0, torch.where(pos_in < C + L[ex], 1, 2))  # context/history/target
        gaps = torch.exp(torch.rand(tokens, generator=dgen, device=dev, dtype=torch.float64) * math.log(max_gap + 1)) - 1
        gaps = torch.where(pos_in > C, gaps, torch.zeros_like(gaps)).floor().long()
        t0 = (1.6e9 + torch.rand(B, generator=dgen, device=dev, dtype=torch.float64) * 1e8).long()
        ts = t0[ex] + (gaps.cumsum(0) - torch.cat([gaps.new_zeros(1), gaps.cumsum(0)])[start[:-1]][ex])
        # Bags per group: ids in token order and the offsets of each token's bag.
        bags = []
        for gi, g in enumerate(groups):
            counts = torch.zeros(tokens, dtype=torch.long, device=dev)
            parts = []  # (token index, id with its row base) per table of the group
            for t in g:
                if any(t is c for c in contexts):
                    c = next(k for k, e in enumerate(contexts) if e is t)
                    rows = (kind == 0) & (pos_in == c)
                    tok = torch.nonzero(rows).squeeze(1).repeat_interleave(t["pooling_size"])
                else:
                    rows = (kind == 1) | ((kind == 2) & (t is features[0]))
                    tok = torch.nonzero(rows).squeeze(1)
                parts.append((tok, draw(t, tok.numel()) + t["base"]))
                counts.index_add_(0, tok, torch.ones_like(tok))
            tok = torch.cat([p[0] for p in parts])
            order = torch.argsort(tok, stable=True)
            offsets = torch.zeros(tokens + 1, dtype=torch.long, device=dev)
            offsets[1:] = counts.cumsum(0)
            bags.append((torch.cat([p[1] for p in parts])[order], offsets))
        # The attention's chunks: examples sorted by length into padded buckets.
        nl = n.tolist()
        by_len = sorted(range(B), key=lambda b: nl[b])
        chunks, at = [], 0
        for size in sizes:
            members = []
            while at < B and nl[by_len[at]] <= size:
                members.append(by_len[at])
                at += 1
            per = max(1, args.chunk_pairs // (H * size * size))
            for c0 in range(0, len(members), per):
                m = torch.tensor(members[c0:c0 + per], device=dev)
                idx = start[m].view(-1, 1) + torch.arange(size, device=dev).view(1, -1)
                valid = torch.arange(size, device=dev).view(1, -1) < n[m].view(-1, 1)
                chunks.append(dict(valid=valid, flat=idx[valid], ts=ts[idx.clamp(max=tokens - 1)],
                                   hist=n[m] - T, total=n[m]))
        inverse = torch.argsort(torch.cat([c["flat"] for c in chunks]))  # chunk order -> token order
        target_rows = torch.nonzero(kind == 2).squeeze(1)
        labels = torch.randint(0, 2, (B * T, tasks), generator=dgen, device=dev).float()
        pairs = sum(int(c["valid"].shape[0]) * c["valid"].shape[1] ** 2 for c in chunks)
        return dict(tokens=tokens, bags=bags, chunks=chunks, inverse=inverse, target_rows=target_rows, labels=labels,
                    padded_pairs=pairs, pairs=int((n * n).sum()))

    batches = [make_batch() for _ in range(args.pool)]

    def embed(b):
        outs = [F.embedding_bag(ids, w, off, mode="sum", sparse=True, include_last_offset=True)
                for (ids, off), w in zip(b["bags"], weights)]
        if concat:
            x = torch.cat(outs[:len(features)], 1)
            return x + outs[-1] if contexts else x
        return outs[0]

    def attend(b, act, l):
        """The attention of layer l over every chunk; the jagged output gathered back in one go.
        Each chunk is padded by scattering its tokens' rows into zeros: a gather whose padding
        read one shared zero row made its backward add every padded position into that row."""
        vqk = act[:, hv:]  # V, Q, K
        outs = []
        for c in b["chunks"]:
            nb, N = c["valid"].shape
            g = vqk.new_zeros(nb, N, vqk.shape[1])
            g[c["valid"]] = vqk.index_select(0, c["flat"])
            o = attention(g[..., hv:hv + ha].reshape(nb, N, H, A), g[..., hv + ha:].reshape(nb, N, H, A),
                          g[..., :hv].reshape(nb, N, H, V), c["ts"], c["hist"], c["total"],
                          dense.pos[l], dense.tim[l])
            outs.append(o.reshape(nb, N, hv)[c["valid"]])
        return torch.cat(outs)[b["inverse"]], act[:, :hv]

    def forward_loss(b):
        x = embed(b).float()
        for l in range(layers):
            act = pre(x, dense.ln_w[l], dense.ln_b[l], dense.uvqk[l].weight, dense.uvqk[l].bias)
            o, u = attend(b, act, l)
            x = post(x, o, u, dense.out[l].weight, dense.out[l].bias)
        return head(x[b["target_rows"]], b["labels"])

    # ---- optimizers ----
    dspec = y["optimizer"]["dense"]
    dense_opt = torch.optim.AdamW(dense.parameters(), lr=float(dspec["lr"]), eps=float(dspec.get("eps", 1e-8)),
                                  weight_decay=float(dspec.get("weight_decay", 0.0)),
                                  betas=(dspec.get("beta1", 0.9), dspec.get("beta2", 0.999)),
                                  **({"fused": True} if dev.type == "cuda" else {}))
    espec = y["optimizer"]["embedding"]
    if espec["kind"] != "rowwise_adagrad":
        sys.exit(f"{args.model}: only rowwise_adagrad tables are written here, not {espec['kind']}")
    e_lr, e_eps = float(espec["lr"]), float(espec.get("eps", 1e-8))

    @torch.no_grad()
    def embedding_update():
        for k, w in enumerate(weights):
            g, w.grad = w.grad.coalesce(), None  # unique rows, duplicates summed
            rows, vals = g.indices()[0], g.values().float()
            s = states[k].index_select(0, rows).add_(torch.linalg.vector_norm(vals, dim=1).square_() / w.shape[1])
            states[k].index_copy_(0, rows, s)
            new = w.index_select(0, rows).float() - vals * (e_lr / (s.sqrt_() + e_eps)).unsqueeze(1)
            w.index_copy_(0, rows, new.to(w.dtype))

    def step(b):
        dense_opt.zero_grad(set_to_none=True)
        loss = forward_loss(b)
        loss.backward()
        dense_opt.step()
        embedding_update()
        return loss.detach()

    if args.check:
        check(torch, F, args, batches[0], weights, states, forward_loss, embedding_update, attend, e_lr, e_eps,
              H, A, V, P, TB, inv_n, dense, hv, ha)

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t_compile = time.perf_counter()
    print(f"batches: {args.pool} made, {sum(len(b['chunks']) for b in batches) / args.pool:.0f} attention chunks a "
          f"layer; warm-up", flush=True)
    for i in range(args.warmup):
        loss = step(batches[i % args.pool])
        sync()
        print(f"  warm-up step {i + 1}: {time.perf_counter() - t_compile:.1f} s", flush=True)
    t_compile = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    if cuda:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    for i in range(args.steps):
        loss = step(batches[(args.warmup + i) % args.pool])
    if cuda:
        stop.record()
    sync()
    ms = (start.elapsed_time(stop) if cuda else (time.perf_counter() - t0) * 1e3) / args.steps
    loss = float(loss)
    if not math.isfinite(loss):
        sys.exit(f"loss is {loss}")
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    name = torch.cuda.get_device_name() if cuda else "cpu"
    mode = "compile" if args.compile else "eager"
    tokens = sum(b["tokens"] for b in batches) / len(batches)
    pad = sum(b["padded_pairs"] for b in batches) / sum(b["pairs"] for b in batches)
    print(f"{y['name']}: {B * 1e3 / ms:,.0f} examples/s, {ms:.2f} ms/step ({args.steps} steps after {args.warmup} "
          f"warm-up, {t_compile:.0f} s), batch {B} ({tokens:,.0f} tokens), padded pairs {pad:.2f}x the jagged, "
          f"peak {peak:.1f} GB, loss {loss:.4f}; dense {args.dense_math} {mode}, tables {args.table_dtype} "
          f"rowwise_adagrad{f', rows cap {args.rows_cap:,}' if args.rows_cap else ''}; {name}, torch {torch.__version__}")
    if args.profile and cuda:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(2):
                step(batches[i % args.pool])
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))
    result = dict(model=y["name"], rows_cap=args.rows_cap, batch=B, dense_math=args.dense_math,
                  table_dtype=args.table_dtype, compile=args.compile, examples_per_s=round(B * 1e3 / ms, 1),
                  ms_per_step=round(ms, 4), tokens=round(tokens), padded_pairs_ratio=round(pad, 3),
                  peak_mem_gb=round(peak, 3), loss=round(loss, 6), warmup_s=round(t_compile, 1), device=name,
                  torch=torch.__version__, steps=args.steps, warmup=args.warmup, pool=args.pool, seed=args.seed,
                  model_file=str(args.model))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def check(torch, F, args, b, weights, states, forward_loss, embedding_update, attend, lr, eps, H, A, V, P, TB,
          inv_n, dense, hv, ha):
    """--check: the bucketed attention against a per-pair loop over the jagged tokens, and one
    rowwise Adagrad update against its formula."""
    with torch.no_grad():
        act = torch.randn(b["tokens"], 2 * hv + 2 * ha, device=weights[0].device)
        got, _ = attend(b, act, 0)
        want = torch.zeros_like(got)
        pos, tim = dense.pos[0].float(), dense.tim[0].float()
        ts = torch.empty(b["tokens"], dtype=torch.long, device=act.device)
        for c in b["chunks"]:
            ts[c["flat"]] = c["ts"][c["valid"]]
        for c in b["chunks"]:
            first = 0
            for r in range(c["valid"].shape[0]):
                n = int(c["valid"][r].sum())
                rows = c["flat"][first:first + n]
                first += n
                hist = int(c["hist"][r])
                for h in range(H):
                    q = act[rows, 2 * hv + h * A:2 * hv + (h + 1) * A]
                    k = act[rows, 2 * hv + ha + h * A:2 * hv + ha + (h + 1) * A]
                    v = act[rows, hv + h * V:hv + (h + 1) * V]
                    for i in range(n):
                        js = [j for j in range(i + 1) if j < hist or j == i]
                        dt = (ts[rows[i]] - ts[rows[js]]).clamp(min=0)
                        tb = torch.tensor([min(int(x).bit_length(), TB - 1) for x in dt.tolist()], device=act.device)
                        s = (k[js] @ q[i]) / math.sqrt(A) + pos[h, torch.tensor([min(i - j, P - 1) for j in js], device=act.device)] + tim[h, tb]
                        want[rows[i], h * V:(h + 1) * V] = (F.silu(s) * inv_n) @ v[js]
        err = float((got.float() - want).abs().max() / want.abs().max())
        assert err < (2e-2 if args.dense_math == "bf16" else 1e-5), f"bucketed attention differs: {err:.2e}"
        print(f"check: bucketed attention == the per-pair loop over {b['tokens']} tokens (max error {err:.1e} "
              f"of the largest output)")
    loss = forward_loss(b)
    loss.backward()
    w0, s0 = [w.detach().float().clone() for w in weights], [s.clone() for s in states]
    G = [w.grad.coalesce().to_dense().float() for w in weights]
    touched = [torch.zeros(w.shape[0], dtype=torch.bool, device=w.device).index_fill_(0, ids, True)
               for w, (ids, _) in zip(weights, b["bags"])]
    embedding_update()
    for k, w in enumerate(weights):
        s = s0[k] + touched[k] * G[k].square().mean(1)
        want = torch.where(touched[k].unsqueeze(1), w0[k] - lr * G[k] / (s.sqrt() + eps).unsqueeze(1), w0[k])
        assert torch.allclose(states[k], s, rtol=1e-5, atol=1e-12), "rowwise state differs"
        assert torch.allclose(w.detach().float(), want, rtol=1e-3 if w.dtype == torch.float16 else 1e-5,
                              atol=1e-3 if w.dtype == torch.float16 else 1e-7), "rowwise update differs"
    print(f"check: rowwise Adagrad == its formula on {int(sum(t.sum() for t in touched)):,} touched rows; "
          f"loss {float(loss.detach()):.4f}")


if __name__ == "__main__":
    sys.exit(main())
