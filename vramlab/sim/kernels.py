"""CUDA attention kernels as the simulated device accounts them.

`F.scaled_dot_product_attention` picks a different kernel on a CPU than on a GPU, and the kernels
keep different tensors for backward. On CUDA (PyTorch 2.x, sm80+):

* **flash** (fp16/bf16, no explicit mask, head_dim <= 256): keeps q, k, v, the output and an fp32
  log-sum-exp of shape [B, H, L]; attention dropout is regenerated from the RNG seed, so no mask is
  kept. Backward allocates dq, dk, dv plus an fp32 dq accumulator and an fp32 [B, H, L] buffer.
* **memory-efficient** (fp32 too, masks allowed): keeps q, k, v, output and an fp32 log-sum-exp of
  [B, H, ceil(L/32)*32]; dropout is regenerated from a Philox seed. Backward allocates dq, dk, dv
  and an fp32 [B, H, L] `delta`.
* both write their output as [B, L, H, D] and return a [B, H, L, D] transposed view, so the usual
  `out.transpose(1, 2).contiguous()` afterwards copies nothing.

Neither stores the [L, L] score matrix (Dao et al., 2022, "FlashAttention"; Rabe & Staats, 2021,
"Self-attention does not need O(n^2) memory"). The CPU's own kernels differ: with dropout the
CPU falls back to the math path and keeps the scores, which is why a naive CPU measurement of a
GPT-2 step with attention dropout reads 45% high (see vramlab/data/h200_gpt2_peaks.md).

`EmulatedSDPA` computes the real result with the CPU kernel while the tracker is paused, then
charges exactly the tensors the CUDA kernel would hold. Under FakeTensorMode nothing is computed.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from torch._subclasses.fake_tensor import is_fake


def cuda_kernel_for(q, k, v, attn_mask, dropout_p) -> str:
    """Which SDPA backend CUDA's dispatcher would choose for these inputs (sm80+)."""
    head_dim = q.shape[-1]
    if (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and head_dim <= 256
            and head_dim % 8 == 0 and k.shape[1] == q.shape[1]):
        return "flash"
    if q.dtype in (torch.float16, torch.bfloat16, torch.float32) and head_dim % 4 == 0:
        return "efficient"
    return "math"


def _lse_len(kernel: str, length: int) -> int:
    return -(-length // 32) * 32 if kernel == "efficient" else length


class EmulatedSDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, kernel, device):
        fake = is_fake(q)
        B, H, L, D = q.shape
        Dv = v.shape[-1]
        ctx.args = (attn_mask, dropout_p, is_causal, scale, enable_gqa, kernel, device)
        ctx.rng_state = None
        with device.untracked():
            if fake:
                result = torch.empty(B, H, L, Dv, dtype=q.dtype)
            else:
                if dropout_p > 0:
                    ctx.rng_state = torch.get_rng_state()
                result = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                        is_causal=is_causal, scale=scale,
                                                        enable_gqa=enable_gqa)
        # Charged allocations: output in [B, L, H, D] layout, fp32 log-sum-exp.
        out = torch.empty(B, L, H, Dv, dtype=q.dtype)
        out.copy_(result.transpose(1, 2)) if not fake else None
        lse = torch.empty(B, H, _lse_len(kernel, L), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        attn_mask, dropout_p, is_causal, scale, enable_gqa, kernel, device = ctx.args
        B, H, L, D = q.shape
        # Workspace the CUDA backward holds while it runs (freed on return).
        workspace = [torch.empty(B, H, _lse_len(kernel, L), dtype=torch.float32)]
        if kernel == "flash":
            workspace.append(torch.empty(B, L, H, -(-D // 32) * 32, dtype=torch.float32))   # dq_accum
        if is_fake(q):
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        else:
            # plain CPU autograd: with the emulation's function mode on, this F.sdpa would become
            # another EmulatedSDPA whose own backward recomputes the attention a second time
            with device.untracked(), torch.enable_grad(), torch._C.DisableTorchFunction():
                qd, kd, vd = (t.detach().requires_grad_() for t in (q, k, v))
                # the forward's dropout mask again (fork_rng costs more than a small attention: only then)
                with (torch.random.fork_rng(devices=[]) if ctx.rng_state is not None else contextlib.nullcontext()):
                    if ctx.rng_state is not None:
                        torch.set_rng_state(ctx.rng_state)
                    o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=attn_mask, dropout_p=dropout_p,
                                                       is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
                grads = torch.autograd.grad(o, (qd, kd, vd), grad_out)
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            for dst, src in zip((dq, dk, dv), grads):
                dst.copy_(src)
        del workspace
        return dq, dk, dv, None, None, None, None, None, None, None


def emulated_sdpa(device, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
    """Drop-in for F.scaled_dot_product_attention on the simulated device."""
    kernel = cuda_kernel_for(query, key, value, attn_mask, dropout_p)
    if kernel == "math" or query.dim() != 4:
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    return EmulatedSDPA.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                              kernel, device)
