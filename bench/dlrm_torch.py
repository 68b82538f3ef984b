#!/usr/bin/env python3
"""PyTorch peer of parity's DLRM training step (DLRM-DCNv2 or dot), from the same model YAML.

Why it is built this way: to say what plain PyTorch reaches on the same GPU for the model parity
trains, so parity's examples/s has a peer. The model is parity's engine (src/engine/model.cpp)
written with stock PyTorch ops: bottom MLP (ReLU after every layer), embedding bags, dcnv2
(x_{l+1} = x0 * (W (V x_l) + b) + x_l) or dot interaction (bottom output, then the strict lower
triangle of the Gram matrix, row-major), top MLP (no ReLU on the logit), mean BCE with logits;
the same initialisation rules and the same optimizer formulas (Adagrad: sqrt(sum) + eps).
The same as parity: shapes, math, optimizer kinds, plan's rowwise Adagrad for the tables (the
default here), batch. Not the same: the random numbers (weights and data differ), the data
(random ids, normal dense features, Bernoulli(0.5) labels, not parity's planted teacher; zipf
tables sample a continuous approximation of the zipf law), and the data path: --pool batches
are generated ON THE GPU before timing, with table row offsets already added to the ids, and
cycled, so PyTorch is never host-bound (parity's step also uploads its input batch). All
tables of equal dim live in ONE EmbeddingBag weight (bags table-major), the way a fused table
batch would; the rowwise optimizer is hand-written (sparse grad -> coalesce -> index ops).

Usage:
  python3 bench/dlrm_torch.py [--model configs/models/mlperf-dlrmv2.yaml] [--batch N]
      [--rows-cap N] [--dense-math fp32|tf32|bf16] [--compile] [--compile-mode MODE]
      [--embedding-optimizer rowwise_adagrad|adagrad|sgd] [--pool 4] [--warmup 10] [--steps 50]
      [--seed 0]
  python3 bench/dlrm_torch.py --check [--model configs/models/tiny-dot.yaml]  # tiny model, CPU ok
  python3 bench/dlrm_torch.py --selftest-yaml     # fallback YAML parser vs PyYAML (no torch)
Prints a human line and, last, `RESULT {json}`. Exit code 3: the model did not fit in GPU memory
(rerun with e.g. --rows-cap 2000000).
"""
import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ YAML (subset) ----
# PyYAML when installed; otherwise this parser for what configs/models/*.yaml use: block maps and
# lists, flow maps/lists, `- {...}` items, comments, quoted strings, YAML 1.1 scalars.
_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?$|\.[0-9_]+(?:[eE][-+][0-9]+)?$")
_KEY = re.compile(r"([^\s\-\[\]{},#'\"][^:]*?|-[^\s:][^:]*?)\s*:(?:\s+(.*))?$")


class _Incomplete(Exception):
    pass


_WORDS = {w: v for v, ws in ((None, "~ null Null NULL"), (True, "true True TRUE yes Yes YES on On ON"),
                          (False, "false False FALSE no No NO off Off OFF")) for w in ws.split()}


def _scalar(s):  # plain scalars resolved as PyYAML (YAML 1.1) does, for the forms we meet
    if s == "" or s in _WORDS:
        return _WORDS.get(s)
    if re.fullmatch(r"[-+]?(?:0|[1-9][0-9_]*)", s):
        return int(s.replace("_", ""))
    if _FLOAT.match(s):
        return float(s.replace("_", ""))
    if re.fullmatch(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", s):
        return float(s.replace(".", "").lower())
    return s


def _strip_comment(line):
    q, i = None, 0
    while i < len(line):
        c = line[i]
        if q:
            if (c == "\\" and q == '"') or (c == q == "'" and line[i + 1:i + 2] == "'"):
                i += 1  # an escape: skip the next character
            elif c == q:
                q = None
        elif c in "\"'" and (i == 0 or line[i - 1] in " \t[{,:"):
            q = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


class _Flow:
    """Recursive descent over one flow/scalar value: {a: 1, b: [x, 'y']}."""

    def __init__(self, s):
        self.s, self.i = s, 0

    def _peek(self):
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1
        if self.i >= len(self.s):
            raise _Incomplete()
        return self.s[self.i]

    def value(self, flow):
        c = self._peek()
        if c in "{[":
            self.i += 1
            out, close = ({}, "}") if c == "{" else ([], "]")
            while self._peek() != close:
                if c == "{":
                    k = self.value(True)
                    if self._peek() != ":":
                        raise ValueError(f"expected ':' in {self.s!r}")
                    self.i += 1
                    out[k] = None if self._peek() in ",}" else self.value(True)
                else:
                    out.append(self.value(True))
                if self._peek() == ",":
                    self.i += 1
                elif self._peek() != close:
                    raise ValueError(f"expected ',' or '{close}' in {self.s!r}")
            self.i += 1
            return out
        if c in "\"'":
            j, buf = self.i + 1, []
            while True:
                if j >= len(self.s):
                    raise _Incomplete()
                ch = self.s[j]
                if ch == c and c == "'" and self.s[j + 1:j + 2] == "'":
                    buf.append("'"); j += 2; continue
                if ch == c:
                    break
                if ch == "\\" and c == '"':
                    j += 1
                    ch = {"n": "\n", "t": "\t", "0": "\0"}.get(self.s[j], self.s[j])
                buf.append(ch); j += 1
            self.i = j + 1
            return "".join(buf)
        j = self.i  # plain scalar: up to ': ' (and, inside [] or {}, up to a flow indicator)
        while j < len(self.s) and not (flow and self.s[j] in ",[]{}") and not (
                self.s[j] == ":" and self.s[j + 1:j + 2] in ("", " ", "\t") + ((",", "]", "}") if flow else ())):
            j += 1
        text, self.i = self.s[self.i:j].strip(), j
        return _scalar(text)

    def whole(self):
        v = self.value(False)
        if self.s[self.i:].strip():
            raise ValueError(f"unexpected text after value: {self.s[self.i:]!r}")
        return v


def _inline(lines, i, text):
    """A value given on the line itself; flow collections may continue on following lines."""
    while True:
        try:
            return _Flow(text).whole(), i + 1
        except _Incomplete:
            i += 1
            if i >= len(lines):
                raise ValueError(f"unterminated flow value: {text!r}")
            text += " " + lines[i][1]


def _node(lines, i):
    ind, text = lines[i]
    if text == "-" or text.startswith("- "):
        out = []
        while i < len(lines) and lines[i][0] == ind and (lines[i][1] == "-" or lines[i][1].startswith("- ")):
            rest = lines[i][1][1:].lstrip()
            if not rest:
                v, i = _node(lines, i + 1) if i + 1 < len(lines) and lines[i + 1][0] > ind else (None, i + 1)
            elif rest == "-" or rest.startswith("- ") or (rest[0] not in "[{\"'" and _KEY.match(rest)):
                lines[i] = (ind + len(lines[i][1]) - len(rest), rest)  # `- k: v`, `- - x` open a node
                v, i = _node(lines, i)
            else:
                v, i = _inline(lines, i, rest)
            out.append(v)
        return out, i
    out = {}
    while i < len(lines) and lines[i][0] == ind:
        m = _KEY.match(lines[i][1])
        if not m:
            raise ValueError(f"cannot parse line: {lines[i][1]!r}")
        key, rest = _Flow(m.group(1)).whole(), m.group(2)
        if rest:
            out[key], i = _inline(lines, i, rest)
        elif i + 1 < len(lines) and (lines[i + 1][0] > ind or
                                     (lines[i + 1][0] == ind and lines[i + 1][1][:2] in ("- ", "-"))):
            out[key], i = _node(lines, i + 1)
        else:
            out[key], i = None, i + 1
    return out, i


def parse_yaml_subset(text):
    lines = []
    for raw in text.splitlines():
        s = _strip_comment(raw)
        if s.strip() and s.strip() != "---":
            lines.append((len(s) - len(s.lstrip(" ")), s.strip()))
    if not lines:
        return None
    v, i = _node(lines, 0)
    if i != len(lines):
        raise ValueError(f"unexpected indentation at: {lines[i][1]!r}")
    return v


def load_yaml(path):
    text = Path(path).read_text()
    try:
        import yaml
    except ImportError:
        return parse_yaml_subset(text)
    return yaml.safe_load(text)


def selftest_yaml():
    import yaml
    extra = ["a: 'it''s # not a comment'  # but this is\nb: [1, -2, 3.5, 1.0e-8, x y, 'q', \"d\\\"q\"]\n"
             "c: {k: v, n: {m: [1, {z: ~}]}, e: }\nd:\n- 1\n- - 2\n  - 3\n-  {a: 1,\n    b: 2}\n",
             "x:\n  - name: t\n    rows: 10\n  -\n    y: true\nz: no\nw: 1e5\nv: -.inf\n"]
    cases = [(p.name, p.read_text()) for p in sorted((REPO / "configs/models").glob("*.yaml"))]
    cases += [(f"inline-{k}", t) for k, t in enumerate(extra)]
    bad = 0
    for name, text in cases:
        try:
            ok = parse_yaml_subset(text) == yaml.safe_load(text)
        except ValueError as e:
            ok = print(f"error: {e}") or False
        bad += not ok
        print(f"{'ok  ' if ok else 'DIFF'} {name}")
    print(f"fallback YAML parser: {len(cases) - bad}/{len(cases)} equal to PyYAML {yaml.__version__}")
    return 1 if bad else 0


# ------------------------------------------------------------------ model spec ----
def read_spec(path, rows_cap):
    y = load_yaml(path)
    d = y.get("table_defaults") or {}
    tables = []
    for e in y["tables"]:
        t = {k: e.get(k, d.get(k)) for k in ("rows", "dim", "pooling_size", "pooling", "distribution", "zipf_alpha")}
        t["pooling_size"] = 1 if t["pooling_size"] is None else int(t["pooling_size"])
        t["pooling"], t["distribution"] = t["pooling"] or "sum", t["distribution"] or "uniform"
        t["rows"] = min(t["rows"], rows_cap) if rows_cap > 0 else t["rows"]
        n = e.get("count")
        tables += [dict(t, name=f"{e['name']}_{k}" if n else e["name"]) for k in range(n or 1)]
    return y, tables


def zipf_ids(n, rows, alpha, gen, dev, torch):
    """Continuous approximation: x ~ density x^-alpha on [0.5, rows + 0.5], rank = round(x) - 1,
    then an affine bijection mod rows scatters the hot ranks (parity samples exactly, by
    rejection-inversion, and scatters with its own permutation)."""
    u = torch.rand(n, generator=gen, device=dev, dtype=torch.float64)
    lo, hi = 0.5, rows + 0.5
    if abs(alpha - 1.0) < 1e-9:
        x = lo * torch.exp(u * math.log(hi / lo))
    else:
        a = 1.0 - alpha
        x = (lo ** a + u * (hi ** a - lo ** a)) ** (1.0 / a)
    rank = x.round().clamp_(1, rows).long() - 1
    mult = 1000003
    while math.gcd(mult, rows) != 1:
        mult += 2
    return (rank * mult + rows // 3) % rows


# ------------------------------------------------------------------ the run ----
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model YAML (default mlperf-dlrmv2; tiny with --check)")
    ap.add_argument("--batch", type=int, default=0, help="default: the YAML's batch_size")
    ap.add_argument("--rows-cap", type=int, default=0, help="cap every table's rows (0: none)")
    ap.add_argument("--dense-math", choices=["fp32", "tf32", "bf16"], default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the dense part")
    ap.add_argument("--compile-mode", default=None, help="e.g. max-autotune-no-cudagraphs (implies --compile)")
    ap.add_argument("--embedding-optimizer", choices=["rowwise_adagrad", "adagrad", "sgd"], default="rowwise_adagrad")
    ap.add_argument("--pool", type=int, default=4, help="distinct pre-generated batches")
    ap.add_argument("--warmup", type=int, default=None, help="default 10 (2 with --check)")
    ap.add_argument("--steps", type=int, default=None, help="default 50 (3 with --check)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="small correctness run (tiny model; CPU if no GPU)")
    ap.add_argument("--selftest-yaml", action="store_true", help="fallback YAML parser vs PyYAML")
    args = ap.parse_args(argv)
    if args.selftest_yaml:
        return selftest_yaml()
    args.compile = args.compile or args.compile_mode is not None
    args.model = args.model or str(REPO / "configs/models" / ("tiny.yaml" if args.check else "mlperf-dlrmv2.yaml"))
    args.warmup = args.warmup if args.warmup is not None else (2 if args.check else 10)
    args.steps = args.steps if args.steps is not None else (3 if args.check else 50)
    if args.steps < 1 or args.pool < 1:
        ap.error("--steps and --pool must be >= 1")
    spec, tables = read_spec(args.model, args.rows_cap)
    args.batch = args.batch or int(spec["batch_size"])

    # Set before torch starts CUDA: fewer fragmentation OOMs with 105 GB of tables and GB-sized
    # sparse gradients (override by setting the variable yourself).
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    import torch
    OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    try:
        return run(torch, args, spec, tables)
    except Exception as e:  # a compile-time OOM arrives wrapped; look down the chain
        c, depth = e, 0
        while c is not None and not (isinstance(c, OOM) or "out of memory" in str(c).lower()
                                     or "ALLOC_FAILED" in str(c)):  # cuBLAS without workspace memory
            c, depth = (c.__cause__ or c.__context__) if depth < 20 else None, depth + 1
        if c is None:
            raise
        rows = sum(t["rows"] for t in tables)
        print(f"DID NOT FIT: {spec['name']} with {rows:,} rows (rows cap {args.rows_cap or 'none'}), "
              f"embedding optimizer {args.embedding_optimizer}, batch {args.batch}: out of GPU memory "
              f"({str(c).splitlines()[0][:200]}); rerun with e.g. --rows-cap 2000000", flush=True)
        return 3


def run(torch, args, spec, tables):
    F = torch.nn.functional
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" and not args.check:
        sys.exit("no CUDA device (only --check runs on the CPU)")
    if args.dense_math == "tf32":  # the legacy switch: torch.compile reads the legacy flags
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(args.seed)
    B, T = args.batch, len(tables)
    dims = [t["dim"] for t in tables]
    fused = len(set(dims)) == 1
    rows_total = sum(t["rows"] for t in tables)
    emb_bytes = sum(t["rows"] * t["dim"] for t in tables) * 4
    state = {"rowwise_adagrad": rows_total * 4, "adagrad": emb_bytes, "sgd": 0}[args.embedding_optimizer]
    print(f"{spec['name']}: {T} tables, {rows_total:,} rows ({emb_bytes / 1e9:.1f} GB fp32 + "
          f"{state / 1e9:.1f} GB {args.embedding_optimizer} state), batch {B}, "
          f"{'one fused EmbeddingBag' if fused else 'one EmbeddingBag per table'}", flush=True)

    m = build(torch, args, spec, tables, dev)
    weights, dense_fn = m.weights, m.dense_fn
    embedding_update, kind, dspec, dense_impl = m.embedding_update, m.kind, m.dspec, m.dense_impl

    # ---- data: --pool batches generated on the device before timing ----
    dgen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    pools = [t["pooling_size"] for t in tables]

    def offsets_for(ps):
        lengths = torch.tensor(ps, device=dev).repeat_interleave(B)
        return torch.cat([torch.zeros(1, dtype=torch.long, device=dev), lengths.cumsum(0)])

    offsets = [offsets_for(pools)] if fused else [offsets_for([p]) for p in pools]
    batches = []
    for _ in range(args.pool):
        ids = []
        for t in tables:
            n, rows = B * t["pooling_size"], t["rows"]
            r = (zipf_ids(n, rows, float(t["zipf_alpha"]), dgen, dev, torch) if t["distribution"] == "zipf"
                 else torch.randint(0, rows, (n,), generator=dgen, device=dev))
            ids.append(r + t["base"])
        batches.append(dict(ids=[torch.cat(ids)] if fused else ids,
                            dense=torch.randn(B, int(spec["dense_features"]), generator=dgen, device=dev),
                            labels=torch.randint(0, 2, (B,), generator=dgen, device=dev).float()))

    def embed(b):
        return m.embed(b["ids"], offsets)

    def step(b):
        return m.step(b["dense"], embed(b), b["labels"])

    if args.check:
        run_checks(torch, F, weights, m.states, m.torch_adagrad, kind, (m.e_lr, m.e_eps), tables,
                   batches[0], embed, dense_fn, embedding_update, fused, B)

    # ---- warmup (compile happens here), then --steps timed between synchronizes ----
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(args.warmup):
        loss = step(batches[i % args.pool])
    sync()
    t0 = time.perf_counter()
    if cuda:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    for i in range(args.steps):
        loss = step(batches[(args.warmup + i) % args.pool])
    if cuda:
        stop.record()
    sync()
    ms_step = (start.elapsed_time(stop) if cuda else (time.perf_counter() - t0) * 1e3) / args.steps
    loss = float(loss)
    if not math.isfinite(loss):
        sys.exit(f"loss is {loss}")
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    name = torch.cuda.get_device_name() if cuda else "cpu"
    mode = (args.compile_mode or "default") if args.compile else "eager"
    zipf = sum(t["distribution"] == "zipf" for t in tables)
    print(f"data: {args.pool} distinct batches pre-generated on the {dev.type} before timing and cycled, "
          f"so PyTorch is never host-bound{f'; {zipf} zipf tables: continuous approximation' if zipf else ''}")
    print(f"{spec['name']}: {B * 1e3 / ms_step:,.0f} examples/s, {ms_step:.2f} ms/step ({args.steps} steps after "
          f"{args.warmup} warmup, batch {B}), peak {peak:.1f} GB, loss {loss:.4f}; dense {args.dense_math} {mode}, "
          f"{dspec['kind']} ({dense_impl}); tables {kind}, {'fused' if fused else 'per-table'}"
          f"{f', rows cap {args.rows_cap:,}' if args.rows_cap else ''}; {name}, torch {torch.__version__}")
    result = dict(model=spec["name"], rows_cap=args.rows_cap, batch=B, dense_math=args.dense_math,
                  compile=args.compile, compile_mode=mode, embedding_optimizer=kind,
                  examples_per_s=round(B * 1e3 / ms_step, 1), ms_per_step=round(ms_step, 4),
                  peak_mem_gb=round(peak, 3), loss=round(loss, 6), device=name, torch=torch.__version__,
                  rows=rows_total, steps=args.steps, warmup=args.warmup, pool=args.pool, seed=args.seed,
                  dense_optimizer=f"{dspec['kind']}:{dense_impl}", embedding_storage="fused" if fused else "per-table",
                  zipf_tables=zipf, check=args.check, model_file=str(args.model))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def build(torch, args, spec, tables, dev):
    """The model, its optimizers and its step for `tables` (read_spec's; each gets "base" here, its
    first row in its EmbeddingBag's weight). From args: seed, dense_math, compile, compile_mode,
    embedding_optimizer. The dense weights come from torch's default generator, which the caller
    seeds; the tables from a generator seeded with args.seed."""
    nn, F = torch.nn, torch.nn.functional
    T = len(tables)
    dims = [t["dim"] for t in tables]
    fused = len(set(dims)) == 1

    # ---- embeddings: weights uniform(+-1/sqrt(rows_t)), filled in place in chunks ----
    wgen = torch.Generator(device=dev).manual_seed(args.seed)
    groups = [list(range(T))] if fused else [[t] for t in range(T)]
    bags = []
    for g in groups:
        w = torch.empty(sum(tables[t]["rows"] for t in g), dims[g[0]], device=dev)
        base = 0
        for t in g:
            a = 1.0 / math.sqrt(tables[t]["rows"])
            for lo in range(0, tables[t]["rows"], 1 << 22):
                hi = min(lo + (1 << 22), tables[t]["rows"])
                w[base + lo:base + hi].uniform_(-a, a, generator=wgen)
            tables[t]["base"], base = base, base + tables[t]["rows"]
        mode = "sum" if fused else tables[g[0]]["pooling"]
        bags.append(nn.EmbeddingBag(w.shape[0], w.shape[1], mode=mode, sparse=True,
                                    include_last_offset=True, _weight=w))
    weights = [b.weight for b in bags]

    # ---- dense part ----
    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            def mlp(n_in, sizes):
                layers = []
                for n_out in sizes:
                    layers.append(nn.Linear(n_in, n_out, device=dev))
                    nn.init.xavier_uniform_(layers[-1].weight)  # Glorot: sqrt(6 / (in + out))
                    nn.init.zeros_(layers[-1].bias)
                    n_in = n_out
                return nn.ModuleList(layers)
            self.bottom = mlp(int(spec["dense_features"]), spec["bottom_mlp"])
            D = spec["bottom_mlp"][-1]
            self.kind = spec["interaction"]["kind"]
            N, Fn = D + sum(dims), T + 1
            self.v, self.w = nn.ModuleList(), nn.ModuleList()
            if self.kind == "dcnv2":
                r = spec["interaction"]["low_rank"]
                for _ in range(spec["interaction"]["cross_layers"]):
                    self.v.append(nn.Linear(N, r, bias=False, device=dev))  # V [r, N]
                    self.w.append(nn.Linear(r, N, device=dev))  # W [N, r], b [N]
                    nn.init.xavier_uniform_(self.v[-1].weight)
                    nn.init.xavier_uniform_(self.w[-1].weight)
                    nn.init.zeros_(self.w[-1].bias)
                top_in = N
            else:
                assert all(d == D for d in dims), "dot interaction needs every table dim == last bottom_mlp size"
                li, lj = torch.tril_indices(Fn, Fn, offset=-1, device=dev)  # (1,0), (2,0), (2,1), ...
                self.register_buffer("li", li)
                self.register_buffer("lj", lj)
                top_in = D + Fn * (Fn - 1) // 2
            self.top = mlp(top_in, spec["top_mlp"])
            scale = [1.0 / max(t["pooling_size"], 1) if t["pooling"] == "mean" else 1.0 for t in tables]
            self.register_buffer("scale", torch.tensor(scale, device=dev).view(T, 1, 1)
                                 if fused and any(s != 1.0 for s in scale) else None)

        def forward(self, dense, pooled, labels):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.dense_math == "bf16"):
                x = dense
                for layer in self.bottom:
                    x = torch.relu(layer(x))
                n = x.shape[0]
                if fused:  # [T*B, D] table-major -> [B, T, D]
                    e = pooled.view(T, n, -1)
                    e = (e * self.scale if self.scale is not None else e).transpose(0, 1)
                else:
                    e = pooled  # [B, sum dims]
                if self.kind == "dcnv2":
                    x0 = torch.cat([x, e.reshape(n, -1)], 1)
                    h = x0
                    for v, w in zip(self.v, self.w):
                        h = x0 * w(v(h)) + h
                else:
                    z = torch.cat([x.unsqueeze(1), e.reshape(n, T, -1)], 1)  # [B, F, D]
                    gram = torch.bmm(z, z.transpose(1, 2))
                    h = torch.cat([x, gram[:, self.li, self.lj]], 1)
                for i, layer in enumerate(self.top):
                    h = layer(h)
                    h = torch.relu(h) if i + 1 < len(self.top) else h
            return F.binary_cross_entropy_with_logits(h.float().squeeze(1), labels)

    dense_mod = Dense()
    dense_fn = torch.compile(dense_mod, mode=args.compile_mode) if args.compile else dense_mod

    # ---- optimizers ----
    def opt_args(o):
        return float(o["lr"]), float(o.get("eps", 1e-8)), float(o.get("weight_decay", 0.0))

    dspec = spec["optimizer"]["dense"]
    lr, eps, wd = opt_args(dspec)
    cls, kw = {"adagrad": (torch.optim.Adagrad, dict(lr=lr, eps=eps, weight_decay=wd)),
               "sgd": (torch.optim.SGD, dict(lr=lr, weight_decay=wd)),
               "adam": (torch.optim.AdamW, dict(lr=lr, eps=eps, weight_decay=wd,  # decoupled, as parity
                                                betas=(dspec.get("beta1", 0.9), dspec.get("beta2", 0.999))))}[dspec["kind"]]
    dense_impl = "default"
    for impl in ("fused", "foreach"):  # probe: fused Adagrad is CPU-only in some releases
        try:
            p = torch.zeros(4, device=dev, requires_grad=True)
            p.grad = torch.ones_like(p)
            cls([p], **kw, **{impl: True}).step()
            kw[impl], dense_impl = True, impl
            break
        except (RuntimeError, TypeError, ValueError):
            pass
    dense_opt = cls(dense_mod.parameters(), **kw)

    e_lr, e_eps, e_wd = opt_args(spec["optimizer"]["embedding"])
    kind = args.embedding_optimizer
    states = [torch.zeros(w.shape[0], device=dev) for w in weights] if kind == "rowwise_adagrad" else []
    torch_adagrad = torch.optim.Adagrad(weights, lr=e_lr, eps=e_eps, weight_decay=e_wd, foreach=False) if kind == "adagrad" else None

    @torch.no_grad()
    def embedding_update():
        if torch_adagrad is not None:  # per-element state, sparse path of torch.optim.Adagrad
            torch_adagrad.step()
            torch_adagrad.zero_grad(set_to_none=True)
            return
        for k, w in enumerate(weights):
            g, w.grad = w.grad, None
            if kind == "sgd" and e_wd == 0.0:  # duplicates just add up: no coalesce needed
                w.index_add_(0, g._indices()[0], g._values(), alpha=-e_lr)
                continue
            g = g.coalesce()  # unique rows, duplicate occurrences summed
            rows, vals = g.indices()[0], g.values()
            if e_wd:
                vals = vals + e_wd * w.index_select(0, rows)
            if kind == "sgd":
                w.index_add_(0, rows, vals, alpha=-e_lr)
                continue
            # s_row += mean_d g^2 (vector_norm: no [rows, dim] temporary of squares)
            s = states[k].index_select(0, rows).add_(torch.linalg.vector_norm(vals, dim=1).square_() / w.shape[1])
            states[k].index_copy_(0, rows, s)
            w.index_add_(0, rows, vals.mul_((-e_lr / (s.sqrt_() + e_eps)).unsqueeze(1)))

    def embed(ids, offsets):
        """Pooled rows: [T*B, D] table-major (one fused bag) or [B, sum dims]."""
        outs = [bag(i, o) for bag, i, o in zip(bags, ids, offsets)]
        return outs[0] if fused else torch.cat(outs, 1)

    def step(dense, pooled, labels):
        dense_opt.zero_grad(set_to_none=True)
        loss = dense_fn(dense, pooled, labels)
        loss.backward()
        dense_opt.step()
        embedding_update()
        return loss.detach()

    return SimpleNamespace(bags=bags, weights=weights, fused=fused, dense_mod=dense_mod, dense_fn=dense_fn,
                           dense_opt=dense_opt, dense_impl=dense_impl, dspec=dspec, kind=kind, states=states,
                           torch_adagrad=torch_adagrad, e_lr=e_lr, e_eps=e_eps,
                           embedding_update=embedding_update, embed=embed, step=step)


def run_checks(torch, F, weights, states, torch_adagrad, kind, hyper, tables, b, embed, dense_fn,
               embedding_update, fused, B):
    """--check: the fused layout against per-table bags, and one embedding update against a
    dense re-computation of its formula."""
    if sum(w.numel() for w in weights) > 5e7:
        print("check: tables too large to verify densely; skipped (use a small model)")
        return
    with torch.no_grad():
        out = embed(b)
        if fused:
            out, start = out.view(len(tables), B, -1), 0
            for t, tb in enumerate(tables):
                p, rows = tb["pooling_size"], tb["rows"]
                ids = b["ids"][0][start:start + B * p] - tb["base"]
                start += B * p
                ref = F.embedding_bag(ids, weights[0][tb["base"]:tb["base"] + rows],
                                      torch.arange(B + 1, device=ids.device) * p, mode="sum",
                                      include_last_offset=True)
                assert torch.allclose(out[t], ref, atol=1e-6), f"fused bag layout differs on table {t}"
            print(f"check: fused EmbeddingBag output == per-table bags for {len(tables)} tables")
    loss = dense_fn(b["dense"], embed(b), b["labels"])
    loss.backward()
    lr, eps = hyper
    w0 = [w.detach().clone() for w in weights]
    s0 = [s.clone() for s in states]
    G = [w.grad.coalesce().to_dense() for w in weights]  # duplicates summed as the update sums them
    a0 = [torch_adagrad.state[w].get("sum", torch.zeros_like(w)).clone() for w in weights] if torch_adagrad else []
    occ = [torch.zeros(w.shape[0], dtype=torch.bool, device=w.device).index_fill_(0, i, True)
           for w, i in zip(weights, b["ids"])]
    embedding_update()  # the benchmark's own update
    for k, w in enumerate(weights):
        g = G[k]
        if kind == "sgd":
            want = w0[k] - lr * g
        elif kind == "adagrad":
            want = w0[k] - lr * g / ((a0[k] + g * g).sqrt() + eps)
        else:
            s = s0[k] + occ[k] * g.square().mean(1)
            want = torch.where(occ[k].unsqueeze(1), w0[k] - lr * g / (s.sqrt() + eps).unsqueeze(1), w0[k])
            assert torch.allclose(states[k], s, rtol=1e-5, atol=1e-12), "rowwise state differs"
        assert torch.allclose(w.detach(), want, rtol=1e-5, atol=1e-7), f"{kind} update differs"
        assert w.grad is None
    print(f"check: {kind} update == its formula on {int(sum(o.sum() for o in occ)):,} touched rows; "
          f"loss {float(loss):.4f}")


if __name__ == "__main__":
    sys.exit(main())
