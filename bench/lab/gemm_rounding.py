# How far the GPU's dense products round (an experiment, not a question): per operand type
# (fp32 without TF32, TF32, bf16 with an fp32 output) and shape, the error of each element and
# of each row's sum over its output columns against an fp64 reference from the operands the
# product read, as a multiple of the random-data model's spread (Higham and Mary 2020):
# sigma = u sqrt((k/2) sum_j sum_k a_ik^2 b_jk^2), u = 2^-24, against the spread GpuBackend's
# checks use, and (bf16) the checks' checksum columns against theirs. docs/reliability.md has the
# figures.
#
#   python3 bench/lab/gemm_rounding.py      # on the GPU machine (PyTorch with CUDA)
import math

import torch

torch.manual_seed(1)
DEV = "cuda"


def run(n, k, m, mode, one_sign=False):
    a = torch.relu(torch.randn(n, k, device=DEV, dtype=torch.float64))
    b = torch.randn(m, k, device=DEV, dtype=torch.float64) / math.sqrt(k)
    if one_sign:  # every term positive: the partial sums drift, rounding errors of one sign show
        b = b.abs()
    if mode == "bf16":
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        try:
            c = torch.mm(a16, b16.t(), out_dtype=torch.float32)
        except Exception:  # older PyTorch: a bf16 output, rounded
            c = torch.mm(a16, b16.t()).float()
            mode = "bf16-out16"
        a, b = a16.double(), b16.double()
    else:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        a32, b32 = a.float(), b.float()
        c = a32 @ b32.t()
        a, b = a32.double(), b32.double()  # tf32: the product's own rounding of them is seen
    ref = a @ b.t()
    e = c.double() - ref
    u = 2.0**-24
    q = (a * a) @ (b * b).t()  # [n, m]: sum_k a^2 b^2
    r_el = e.abs() / (u * torch.sqrt(k / 2 * q))
    row_err = e.sum(1)
    sig_row = u * torch.sqrt((k / 2) * q.sum(1))
    r_row = row_err / sig_row
    rms_c = ref.pow(2).mean().sqrt().item()
    # The spread GpuBackend's checks use (src/backend/gpu/product_checks.cu): the partial sums'
    # mean path and their centred walk, V = (k/3 + 1) sum_j c^2 + (k/2) sum_k a^2 t_k.
    v_rows = (k / 3 + 1) * ref.pow(2).sum(1) + (k / 2) * q.sum(1)
    r_chk = row_err / (u * torch.sqrt(v_rows))
    p9999 = torch.quantile(r_el.flatten()[: 1 << 24].float(), 0.9999)
    aug = ""
    if mode == "bf16":
        # The checksum columns of GpuBackend's checks under bf16 math: the weights' column sums as
        # bf16 hi and lo rows, multiplied by the same product; the rest added in double.
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        s = b16.double().sum(0)
        hi = s.to(torch.bfloat16)
        lo = (s - hi.double()).to(torch.bfloat16)
        rest = s - hi.double() - lo.double()
        c_aug = torch.mm(a16, torch.cat([b16, hi[None], lo[None]]).t(), out_dtype=torch.float32)
        c_aug = c_aug.double()
        diff = c_aug[:, :m].sum(1) - c_aug[:, m] - c_aug[:, m + 1] - a @ rest
        t = (b * b).sum(0)
        v_aug = (k / 3 + 1) * c_aug.pow(2).sum(1) + (k / 2) * ((a * a) @ t + (a * a) @ (s * s))
        r_aug = diff / (2 * u * torch.sqrt(v_aug))
        aug = (
            f"; checksum columns: rms {r_aug.pow(2).mean().sqrt():.3f} max "
            f"{r_aug.abs().max():.3f} mean {r_aug.mean():+.3f}"
        )
    print(
        f"{mode:10s} n {n} k {k:5d} m {m:5d}: element err/sigma: mean {r_el.mean():.3f} "
        f"p99.99 {p9999:.2f} max {r_el.max():.2f}; row-sum err/sigma: rms "
        f"{r_row.pow(2).mean().sqrt():.3f} max {r_row.abs().max():.2f}; row sigma / rms(c) "
        f"{(sig_row.mean() / rms_c):.2e}; mean signed row err/sigma {r_row.mean():+.3f}; "
        f"against the checks' spread: rms {r_chk.pow(2).mean().sqrt():.3f} "
        f"max {r_chk.abs().max():.3f} mean {r_chk.mean():+.3f}{aug}{' one-sign' if one_sign else ''}"
    )


for one_sign in [False, True]:
    for mode in ["fp32", "bf16"] if one_sign else ["fp32", "tf32", "bf16"]:
        for n, k, m in [(16384, 256, 256), (16384, 1024, 1024), (8192, 3456, 512), (8192, 512, 3456),
                        (4096, 3456, 3456)]:
            run(n, k, m, mode, one_sign)
