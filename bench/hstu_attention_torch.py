"""HSTU pointwise attention in PyTorch, the padded dense formulation, as the peer of parity's
attention kernel (docs/perf/hstu.md): out = (SiLU(Q K^T / sqrt(a) + rab) * mask / n) V with a
causal mask whose last `targets` rows see the history and themselves, bf16, [B, heads, n, dim].
Times forward and forward+backward, eager and torch.compile, and prints TFLOP/s with the causal
FLOPs 2 n^2 h (a + v) / 2 per sequence forward and 3.5x that forward+backward (the backward as
2.5 forwards: the scores again, dA, dV, dQ, dK), beside a bf16 matmul's rate measured in the same
run.

    python3 bench/hstu_attention_torch.py [--lengths 512,2048,8192] [--tokens 32768]
"""
import argparse
import math

import torch

from torch_timing import median_ms


def attention(q, k, v, rab, mask, inv_n):
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1])) + rab
    a = torch.nn.functional.silu(s) * mask * inv_n
    return torch.matmul(a, v)


def mask_for(n, targets, device):
    m = torch.tril(torch.ones(n, n, device=device))
    t0 = n - targets
    m[t0:, t0:] = torch.eye(targets, device=device)
    return m.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="512,2048,8192")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--targets", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm_ms = median_ms(lambda i: torch.matmul(x, x), 3, 10)
    peak = 2 * 8192**3 / (mm_ms * 1e-3) / 1e12
    print(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s")
    compiled = torch.compile(attention)
    print(f"{'n':>6} {'batch':>6} {'impl':>8} {'fwd ms':>8} {'fwd TF/s':>9} {'f+b ms':>8} {'f+b TF/s':>9}")
    for n in [int(s) for s in args.lengths.split(",")]:
        b, h, d = max(args.tokens // n, 1), args.heads, args.dim
        q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16) * 0.5
                   for _ in range(3))
        for t in (q, k, v):
            t.requires_grad_(True)
        rab = (torch.randn(h, n, n, device=dev, dtype=torch.bfloat16) * 0.1)
        mask = mask_for(n, args.targets, dev)
        g = torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16)
        fwd_flops = b * 2 * n * n * h * (d + d) / 2
        for name, fn in (("eager", attention), ("compile", compiled)):
            with torch.no_grad():
                f_ms = median_ms(lambda i: fn(q, k, v, rab, mask, 1.0 / n), 3, args.reps)

            def step(i):
                out = fn(q, k, v, rab, mask, 1.0 / n)
                out.backward(g)

            fb_ms = median_ms(step, 3, args.reps)
            print(f"{n:>6} {b:>6} {name:>8} {f_ms:8.3f} {fwd_flops / f_ms / 1e9:9.1f} "
                  f"{fb_ms:8.3f} {3.5 * fwd_flops / fb_ms / 1e9:9.1f}", flush=True)
        del q, k, v, rab, mask, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
