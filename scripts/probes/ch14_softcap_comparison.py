"""Probe behind chapter 14's soft-capping comparison (docs/chapters/ch14.md, “SDPA 算不了的变换”): causal
attention with Gemma-2-style score soft-capping, c * tanh(S / c), B = 2, H = 4, s = 512, d = 32, c = 5, FP32,
one forward + backward on the simulated device (cuBLAS workspaces off), peak allocated bytes including the
inputs, the output and the gradients; relative errors ||x - ref|| / ||ref|| of the output and of q's gradient
against the eager version:
    .venv/bin/python scripts/probes/ch14_softcap_comparison.py
The eager version is the exercise's starter; the block size is 64 queries.
"""
import datetime
import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.units import MiB

B, H, S, D, CAP, BLOCK = 2, 4, 512, 32, 5.0, 64


def eager(q, k, v):
    seq = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = CAP * torch.tanh(scores / CAP)
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def block(q, k, v, start):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = CAP * torch.tanh(scores / CAP)
    rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    return torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1) @ v


def blocked(q, k, v, recompute):
    outs = []
    for start in range(0, q.shape[-2], BLOCK):
        end = start + BLOCK
        args = (q[..., start:end, :], k[..., :end, :], v[..., :end, :], start)
        outs.append(checkpoint(block, *args, use_reentrant=False) if recompute else block(*args))
    return torch.cat(outs, dim=-2)


IMPLS = [
    ("逐算子（eager）", eager),
    ("分块，不重算", lambda q, k, v: blocked(q, k, v, False)),
    ("分块 + 反向重算", lambda q, k, v: blocked(q, k, v, True)),
    ("整个注意力一个检查点", lambda q, k, v: checkpoint(eager, q, k, v, use_reentrant=False)),
    ("SDPA（没有软上限）", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
]


def run(fn):
    gen = torch.Generator().manual_seed(0)
    host = [torch.randn(B, H, S, D, generator=gen) for _ in range(4)]
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        q, k, v = (t.to(dev.torch_device).requires_grad_() for t in host[:3])
        grad_out = host[3].to(dev.torch_device)
        out = fn(q, k, v)                # fresh device: the peak counts q, k, v and grad_out too
        out.backward(grad_out)
        peak = dev.max_allocated()
        return peak, out.detach().clone(), q.grad.clone()


def rel(a, b):
    return float((a - b).norm() / b.norm())


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {datetime.date.today()}, simulated device (cuBLAS workspaces off)")
    print(f"B={B} H={H} s={S} d={D} c={CAP} FP32, {BLOCK}-query blocks")
    base_peak, base_out, base_gq = run(eager)
    print(f"{'实现':<22}{'峰值 MiB':>10}{'相对逐算子':>10}{'输出相对误差':>14}{'q 梯度相对误差':>16}")
    for name, fn in IMPLS:
        peak, out, gq = run(fn)
        print(f"{name:<22}{peak / MiB:>10.2f}{peak / base_peak:>10.2f}{rel(out, base_out):>14.2g}{rel(gq, base_gq):>16.2g}")
