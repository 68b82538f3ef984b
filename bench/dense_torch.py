#!/usr/bin/env python3
"""PyTorch peer of dense_bench: the same dense ops of a training step, at the same shapes, storage
types and dense math, timed the same way, printed beside parity's times.

dense_bench --dump FILE writes the step's shapes (MLP layers, interaction, batch, dense math, the
storage types of the activations, x0 and the interaction's gradients, the number of input sets
of every op); this script builds each op with stock PyTorch ops:
  linear forward   F.linear with bias, then ReLU (none on the logit layer);
  linear backward  explicit products as autograd makes them: dz = threshold_backward(dy, y, 0),
                   dw = dz^T x, dbias = sum_rows dz, dx = dz w;
  cross forward    u = xl v^T, z = u w^T + b, x_next = addcmul(xl, x0, z) (DCNv2, low rank);
  cross backward   dz = g x0, dx0 (+)= g z, dw = dz^T u, dbias, du = dz w, dv = du^T xl,
                   dxl = g + du v (layer 0 adds g + du v into dx0, as parity's does);
  dot forward      the Gram matrix of the F = tables + 1 vectors as one batched matmul (fp32, as
                   parity's), then [dense | strict lower triangle, row-major];
  dot backward     the triangle scattered into [B, F, F], (G + G^T) T as one batched matmul;
  loss             binary_cross_entropy_with_logits and its gradient through autograd.
Math: bf16 computes the products on bf16 operands (fp32 weights and fp32 inputs cast per call, as
parity converts them), tf32 sets torch.backends.cuda.matmul.allow_tf32, fp32 keeps full fp32.
Tensors are stored as parity stores them, except that the last bottom layer's output and its
gradient are contiguous [B, D] tensors here (parity's are the first D columns of x0 and dx0).
Timing: CUDA events around each call, median of the dump's reps after at least its warm-up
calls (one per input set), inputs random (uniform, non-zero) and rotated among as many sets as
parity used for the op.

Usage:
  python3 bench/dense_torch.py --dump shapes.json --parity dense.json [--out torch.json]
  python3 bench/dense_torch.py --summary dense-bf16.json:torch-bf16.json ...   # one line each
  python3 bench/dense_torch.py --check   # every op on small shapes; backward against autograd
"""
import argparse
import json
import os
import sys

from torch_timing import median_ms


class Peer:
    """The step's dense ops in PyTorch, from dense_bench's shapes."""

    def __init__(self, torch, shapes, device="cuda", wide=None):
        self.torch, self.F = torch, torch.nn.functional
        self.s, self.dev = shapes, device
        self.f32 = wide or torch.float32  # fp32 storage (float64 in --check's comparisons)
        dt = {"fp32": self.f32, "bf16": torch.bfloat16}
        self.act, self.x0t, self.gradt = (dt[shapes[k]] for k in ("activation_dtype", "x0_dtype", "grad_dtype"))
        self.cd = torch.bfloat16 if shapes["math"] == "bf16" else self.f32  # product operands
        self.B = shapes["batch"]
        self.bottom = {l["name"]: l for l in shapes["bottom"]}
        self.top = {l["name"]: l for l in shapes["top"]}

    def rand(self, shape, dtype, lo=-1.0, hi=1.0):
        return self.torch.empty(shape, device=self.dev, dtype=self.f32).uniform_(lo, hi).to(dtype)

    def weight(self, *shape):
        return self.rand(shape, self.f32, -0.05, 0.05)

    # The storage type and width of each layer's input, output and gradients (dense_step.cpp).
    def layer_io(self, name):
        s, B = self.s, self.B
        if name in self.bottom:
            layers, i = s["bottom"], [l["name"] for l in s["bottom"]].index(name)
            last = i + 1 == len(layers)
            x = self.f32 if i == 0 else self.act
            y = self.x0t if last else self.act
            dy = self.gradt if last else self.f32
            dx = None if i == 0 else self.f32
        else:
            layers, i = s["top"], [l["name"] for l in s["top"]].index(name)
            last = i + 1 == len(layers)
            x = (self.act if s["interaction"] == "dcnv2" else self.f32) if i == 0 else self.act
            y = self.f32 if last else self.act
            dy = self.f32
            dx = self.gradt if i == 0 else self.f32
        return layers[i], x, y, dy, dx

    def op(self, name):
        """(setup() -> tensors of one input set, run(tensors)) for the op of that name."""
        torch, F, B, cd, s = self.torch, self.F, self.B, self.cd, self.s
        parts = name.split()
        if parts[0] in self.bottom or parts[0] in self.top:
            l, xt, yt, dyt, dxt = self.layer_io(parts[0])
            relu = l["relu"]
            if parts[1] == "forward":
                def setup():
                    return dict(x=self.rand((B, l["in"]), xt), w=self.weight(l["out"], l["in"]),
                                b=self.weight(l["out"]))

                def run(t):
                    y = F.linear(t["x"].to(cd), t["w"].to(cd), t["b"].to(cd))
                    if relu:
                        y = torch.relu_(y)
                    return y.to(yt)
                return setup, run

            def setup():
                return dict(x=self.rand((B, l["in"]), xt), w=self.weight(l["out"], l["in"]),
                            y=self.rand((B, l["out"]), yt), dy=self.rand((B, l["out"]), dyt))

            def run(t):
                dy, y = t["dy"], t["y"]
                if not relu:
                    dz = dy
                elif dy.dtype == y.dtype:  # what autograd runs for a ReLU
                    dz = torch.ops.aten.threshold_backward(dy, y, 0)
                else:  # parity's fp32 gradient through a bf16 activation
                    dz = torch.where(y > 0, dy, 0.0)
                dzc = dz.to(cd)
                dw = (dzc.t() @ t["x"].to(cd)).to(self.f32)
                db = dz.sum(0, dtype=self.f32)
                dx = (dzc @ t["w"].to(cd)).to(dxt) if dxt is not None else None
                return dw, db, dx
            return setup, run
        if parts[0].startswith("cross."):
            return self.cross(int(parts[0].split(".")[1]), parts[1] == "forward")
        if parts[0] == "dot":
            return self.dot(parts[1] == "forward")
        if name == "loss":
            def setup():
                return dict(z=self.rand((B, 1), self.f32), y=self.rand((B, 1), self.f32, 0.0, 1.0))

            def run(t):
                z = t["z"].detach().requires_grad_()
                loss = F.binary_cross_entropy_with_logits(z, t["y"])
                return torch.autograd.grad(loss, z)[0], loss.detach()
            return setup, run
        raise KeyError(name)

    def cross(self, layer, forward):
        torch, B, cd, s = self.torch, self.B, self.cd, self.s
        N, r, act, gt = s["n"], s["rank"], self.act, self.gradt
        first, xl_is_x0 = layer + 1 == s["cross_layers"], layer == 0
        if forward:
            def setup():
                x0 = self.rand((B, N), self.x0t)
                return dict(x0=x0, xl=x0 if layer == 0 else self.rand((B, N), act), v=self.weight(r, N),
                            w=self.weight(N, r), b=self.weight(N))

            def run(t):
                u = self.F.linear(t["xl"].to(cd), t["v"].to(cd)).to(act)
                z = self.F.linear(u.to(cd), t["w"].to(cd), t["b"].to(cd)).to(act)
                return u, z, torch.addcmul(t["xl"], t["x0"], z)
            return setup, run

        def setup():
            x0 = self.rand((B, N), self.x0t)
            return dict(x0=x0, xl=x0 if layer == 0 else self.rand((B, N), act), v=self.weight(r, N),
                        w=self.weight(N, r), u=self.rand((B, r), act), z=self.rand((B, N), act),
                        g=self.rand((B, N), gt), dx0=self.rand((B, N), gt))

        def run(t):
            g, dx0 = t["g"], t["dx0"]
            dz = g * t["x0"]
            if first:
                torch.mul(g, t["z"], out=dx0)
            else:
                dx0.addcmul_(g, t["z"])
            dzc = dz.to(cd)
            dw = (dzc.t() @ t["u"].to(cd)).to(self.f32)
            db = dz.sum(0, dtype=self.f32)
            du = dzc @ t["w"].to(cd)
            dv = (du.t() @ t["xl"].to(cd)).to(self.f32)
            if xl_is_x0:
                dx0.add_(g).addmm_(du.to(dx0.dtype), t["v"].to(dx0.dtype))
                return dw, db, dv
            return dw, db, dv, torch.addmm(g, du.to(g.dtype), t["v"].to(g.dtype))
        return setup, run

    def dot(self, forward):
        torch, B, s = self.torch, self.B, self.s
        D, N, Fv = s["d"], s["n"], s["tables"] + 1
        li, lj = torch.tril_indices(Fv, Fv, offset=-1, device=self.dev)  # row-major strict lower triangle
        if forward:
            def setup():
                return dict(x0=self.rand((B, N), self.f32))

            def run(t):
                T = t["x0"].view(B, Fv, D)
                Z = torch.bmm(T, T.transpose(1, 2))
                return torch.cat([t["x0"][:, :D], Z[:, li, lj]], 1)
            return setup, run

        def setup():
            return dict(x0=self.rand((B, N), self.f32), dout=self.rand((B, s["inter_out"]), self.f32))

        def run(t):
            T = t["x0"].view(B, Fv, D)
            G = torch.zeros(B, Fv, Fv, device=self.dev, dtype=self.f32)
            G[:, li, lj] = t["dout"][:, D:]
            dT = torch.bmm(G + G.transpose(1, 2), T)
            dT[:, 0] += t["dout"][:, :D]
            return dT.view(B, N)
        return setup, run


def ceilings(torch, math, size, warmup, reps, dev="cuda"):
    """PyTorch's own copy bandwidth (bytes read + written) and product rate, as dense_bench's."""
    copy_bytes = 2 << 30 if dev == "cuda" else 16 << 20
    n = copy_bytes // 4
    a = torch.empty(n, device=dev).uniform_(-1, 1)
    b = torch.empty_like(a)
    wall = dev != "cuda"
    copy = median_ms(lambda i: b.copy_(a) if i % 2 == 0 else a.copy_(b), warmup, reps, wall)
    del a, b
    cd = torch.bfloat16 if math == "bf16" else torch.float32
    xs = [torch.empty(size, size, device=dev).uniform_(-1, 1).to(cd) for _ in range(2)]
    ws = [torch.empty(size, size, device=dev).uniform_(-1, 1).to(cd) for _ in range(2)]
    prod = median_ms(lambda i: torch.nn.functional.linear(xs[i % 2], ws[i % 2]), max(warmup, 2), reps, wall)
    del xs, ws
    if dev == "cuda":
        torch.cuda.empty_cache()
    return 2.0 * copy_bytes / (copy * 1e-3), 2.0 * size ** 3 / (prod * 1e-3)


def summary(items):
    """One line per dense_bench results file (and its torch file): the step's dense ops in all."""
    print(f"{'model, batch, math':36} {'parity ms':>10} {'roof ms':>9} {'pred ms':>9} {'torch ms':>9} "
          f"{'x roof':>7} {'x pred':>7} {'torch/parity':>12}")
    for item in items:
        pfile, _, tfile = item.partition(":")
        if not os.path.exists(pfile):
            print(f"{pfile}: missing (dense_bench failed?)")
            continue
        with open(pfile) as f:
            p = json.load(f)
        tot = p["totals"].get("all", {})
        t_ms = None
        if tfile and os.path.exists(tfile):
            with open(tfile) as f:
                t = json.load(f)
            names = {o["name"] for o in p["ops"]}
            t_ms = sum(o["ms"] for o in t["ops"] if o["name"] in names and o["ms"] is not None)
        label = f"{p['model']}, {p['batch']}, {p['math']}"
        ms = tot.get("ms", float("nan"))
        torch_cells = f"{t_ms:9.3f}" if t_ms else f"{'-':>9}"
        ratio = f"{t_ms / ms:11.2f}x" if t_ms else f"{'-':>12}"
        print(f"{label:36} {ms:10.3f} {tot.get('roofline_ms', 0):9.3f} {tot.get('predicted_ms', 0):9.3f} "
              f"{torch_cells} {ms / tot.get('roofline_ms', 1):7.2f} {ms / tot.get('predicted_ms', 1):7.2f} {ratio}")

def tiny_shapes(interaction, math):
    """A small step in dense_bench's --dump form (for --check)."""
    narrow = "bf16" if math == "bf16" else "fp32"
    dcn = interaction == "dcnv2"
    d, tables = 4, 3
    n = d + tables * d
    inter_out = n if dcn else d + (tables + 1) * tables // 2
    bottom = [{"name": "bottom.0", "in": 5, "out": 8, "relu": True},
              {"name": "bottom.1", "in": 8, "out": d, "relu": True}]
    top = [{"name": "top.0", "in": inter_out, "out": 6, "relu": True},
           {"name": "top.1", "in": 6, "out": 1, "relu": False}]
    inter = [f"cross.{l}" for l in range(3)] if dcn else ["dot"]
    ops = ([f"{l['name']} forward" for l in bottom] + [f"{i} forward" for i in inter] +
           [f"{l['name']} forward" for l in top] + ["loss"] +
           [f"{l['name']} backward" for l in reversed(top)] + [f"{i} backward" for i in reversed(inter)] +
           [f"{l['name']} backward" for l in reversed(bottom)])
    return {"model": f"tiny-{interaction}", "batch": 7, "math": math, "features": 5, "bottom": bottom, "top": top,
            "interaction": interaction, "n": n, "d": d, "rank": 3 if dcn else 0, "cross_layers": 3 if dcn else 0,
            "tables": tables, "inter_out": inter_out, "activation_dtype": narrow,
            "x0_dtype": narrow if dcn else "fp32", "grad_dtype": narrow if dcn else "fp32",
            "reps": 3, "warmup": 1, "product_size": 64, "ops": [{"name": o, "sets": 2} for o in ops]}


def check(torch):
    """Every op runs on small shapes in each math, and each explicit backward matches autograd
    (float64). Runs on the CPU where no GPU is present."""
    F = torch.nn.functional
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    failures = []

    def close(what, got, want):
        err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
        if err > 1e-9:
            failures.append(f"{what}: relative difference {err:.3g}")

    for interaction in ("dcnv2", "dot"):
        for math in ("fp32", "bf16"):  # every op runs, in the storage types of each math
            peer = Peer(torch, tiny_shapes(interaction, math), dev)
            for o in peer.s["ops"]:
                try:
                    setup, run = peer.op(o["name"])
                    run(setup())
                except Exception as e:  # noqa: BLE001 (report every op that fails, then fail)
                    failures.append(f"{interaction} {math} {o['name']}: {type(e).__name__}: {e}")
        s = tiny_shapes(interaction, "fp32")
        peer = Peer(torch, s, dev, wide=torch.float64)
        B, N = s["batch"], s["n"]

        def rand(*shape):
            return torch.empty(shape, device=dev, dtype=torch.float64).uniform_(-1, 1)

        for l in s["bottom"] + s["top"]:
            x, w, b = rand(B, l["in"]).requires_grad_(), rand(l["out"], l["in"]).requires_grad_(), \
                rand(l["out"]).requires_grad_()
            y = F.linear(x, w, b)
            y = torch.relu(y) if l["relu"] else y
            dy = rand(B, l["out"])
            gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy)
            dw, db, dx = peer.op(f"{l['name']} backward")[1](dict(x=x.detach(), w=w.detach(), y=y.detach(), dy=dy))
            close(f"{l['name']} backward dw", dw, gw)
            close(f"{l['name']} backward dbias", db, gb)
            if dx is not None:
                close(f"{l['name']} backward dx", dx, gx)
        for layer in range(s["cross_layers"]):
            first = layer + 1 == s["cross_layers"]
            x0 = rand(B, N).requires_grad_()
            xl = x0 if layer == 0 else rand(B, N).requires_grad_()
            v, w, b = rand(s["rank"], N).requires_grad_(), rand(N, s["rank"]).requires_grad_(), rand(N).requires_grad_()
            u = F.linear(xl, v)
            z = F.linear(u, w, b)
            nxt = x0 * z + xl
            g = rand(B, N)
            wrt = [x0, v, w, b] + ([xl] if layer else [])
            grads = torch.autograd.grad(nxt, wrt, g)
            dx0_before = torch.zeros(B, N, device=dev, dtype=torch.float64) if first else rand(B, N)
            t = dict(x0=x0.detach(), xl=xl.detach(), v=v.detach(), w=w.detach(), u=u.detach(), z=z.detach(), g=g,
                     dx0=dx0_before.clone())
            out = peer.op(f"cross.{layer} backward")[1](t)
            close(f"cross.{layer} backward dx0", t["dx0"], dx0_before + grads[0])
            close(f"cross.{layer} backward dv", out[2], grads[1])
            close(f"cross.{layer} backward dw", out[0], grads[2])
            close(f"cross.{layer} backward dbias", out[1], grads[3])
            if layer:
                close(f"cross.{layer} backward dxl", out[3], grads[4])
            fwd = peer.op(f"cross.{layer} forward")[1](dict(x0=x0.detach(), xl=xl.detach(), v=v.detach(),
                                                            w=w.detach(), b=b.detach()))
            close(f"cross.{layer} forward", fwd[2], nxt.detach())
        if interaction == "dot":
            x0 = rand(B, N).requires_grad_()
            out = peer.op("dot forward")[1](dict(x0=x0))
            d, f = s["d"], s["tables"] + 1
            zs = x0.detach().view(B, f, d)
            want = torch.cat([zs[:, 0]] + [(zs[:, i] * zs[:, j]).sum(1, keepdim=True)
                                           for i in range(1, f) for j in range(i)], 1)
            close("dot forward", out.detach(), want)
            dout = rand(B, s["inter_out"])
            (gx0,) = torch.autograd.grad(out, x0, dout)
            close("dot backward", peer.op("dot backward")[1](dict(x0=x0.detach(), dout=dout)), gx0)
    for f_ in failures:
        print("FAILED", f_)
    print(f"dense_torch --check on {dev}: {'ok' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", help="dense_bench --dump file (the shapes)")
    ap.add_argument("--parity", help="dense_bench --results file")
    ap.add_argument("--out", default="")
    ap.add_argument("--summary", nargs="+", metavar="RESULTS[:TORCH]")
    ap.add_argument("--check", action="store_true", help="the ops on small shapes against autograd (CPU ok)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU, wall-clock timed: a smoke test of this script")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary)
        return 0
    import torch
    if args.check:
        return check(torch)
    if not args.dump:
        ap.error("--dump is required (or --summary, --check)")
    dev = "cpu" if args.cpu else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("dense_torch: no CUDA device (--cpu runs a smoke test on the CPU)", file=sys.stderr)
        return 77
    device_name = torch.cuda.get_device_name() if dev == "cuda" else "the CPU (smoke test)"
    oom = getattr(torch, "OutOfMemoryError", MemoryError)
    with open(args.dump) as f:
        shapes = json.load(f)
    parity = None
    if args.parity and os.path.exists(args.parity):
        with open(args.parity) as f:
            parity = json.load(f)
    math = shapes["math"]
    torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    reps, warmup = shapes["reps"], shapes["warmup"]
    print(f"PyTorch {torch.__version__} on {device_name}: {shapes['model']}, batch {shapes['batch']}, "
          f"{math} math, activations in {shapes['activation_dtype']}", flush=True)
    copy_bps, prod_fps = ceilings(torch, math, shapes["product_size"], warmup, reps, dev)
    print(f"ceilings: copy {copy_bps / 1e12:.2f} TB/s, {math} product {shapes['product_size']}^3 "
          f"{prod_fps / 1e12:.1f} TFLOP/s", flush=True)

    peer = Peer(torch, shapes, dev)
    results = []
    for entry in shapes["ops"]:
        name, nsets = entry["name"], max(2, entry["sets"])
        try:
            setup, run = peer.op(name)
            sets = [setup() for _ in range(nsets)]
            ms = median_ms(lambda i: run(sets[i % nsets]), max(warmup, nsets), reps, dev != "cuda")
        except oom as e:
            print(f"{name}: out of memory ({str(e).splitlines()[0][:160]})", flush=True)
            ms = None
        except KeyError:
            print(f"{name}: no PyTorch op for it here", flush=True)
            ms = None
        except RuntimeError as e:
            print(f"{name}: failed ({str(e).splitlines()[0][:160]})", flush=True)
            ms = None
        sets = None
        if dev == "cuda":
            torch.cuda.empty_cache()
        results.append({"name": name, "ms": ms})
        if ms is not None:
            print(f"  {name:20} {ms:9.3f} ms", flush=True)

    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": device_name, "math": math,
                       "model": shapes["model"], "batch": shapes["batch"], "copy_bytes_per_s": copy_bps,
                       "product_flops_per_s": prod_fps, "ops": results}, f, indent=1)

    # ---- the table, last ----
    pops = {o["name"]: o for o in parity["ops"]} if parity else {}
    print()
    print(f"== parity vs PyTorch {torch.__version__}: {shapes['model']}, batch {shapes['batch']}, {math} math, "
          f"the same shapes and storage types ==")
    if parity:
        print(f"ceilings: copy parity {parity['copy_bytes_per_s'] / 1e12:.2f} TB/s, torch {copy_bps / 1e12:.2f}; "
              f"product parity {parity['product_flops_per_s'] / 1e12:.1f} TFLOP/s, torch {prod_fps / 1e12:.1f}")
    print("torch/parity = PyTorch's time over parity's (above 1: parity is faster)")
    print(f"{'op':20} {'parity ms':>10} {'roof ms':>9} {'pred ms':>9} {'torch ms':>9} {'torch/parity':>12}")
    tp = tt = 0.0
    for r in results:
        p = pops.get(r["name"])
        pm = p["ms"] if p else None
        cells = [f"{pm:10.3f}" if pm is not None else f"{'-':>10}",
                 f"{p['roofline_ms']:9.3f}" if p else f"{'-':>9}",
                 f"{p['predicted_ms']:9.3f}" if p and p["predicted_ms"] is not None else f"{'-':>9}",
                 f"{r['ms']:9.3f}" if r["ms"] is not None else f"{'-':>9}"]
        ratio = f"{r['ms'] / pm:11.2f}x" if pm and r["ms"] is not None else f"{'-':>12}"
        if pm is not None and r["ms"] is not None:
            tp += pm
            tt += r["ms"]
        print(f"{r['name']:20} {' '.join(cells)} {ratio}")
    if tp > 0:
        roof = sum(p["roofline_ms"] for p in pops.values())
        pred = sum(p["predicted_ms"] or 0 for p in pops.values())
        print(f"{'all dense ops':20} {tp:10.3f} {roof:9.3f} {pred:9.3f} {tt:9.3f} {tt / tp:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
