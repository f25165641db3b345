# expect: pass
# 手写 autograd.Function：前向在 no_grad 下按 64 个查询一块算出输出，只为反向保存 q、k、v；
# 反向时逐块用 autograd 重新求这一块的局部梯度，再累加到 dq、dk、dv。和激活检查点同一个思路，自己管理。
import math

import torch


def _block(q, k, v, start, softcap):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    return torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1) @ v


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softcap, block):
        ctx.save_for_backward(q, k, v)
        ctx.softcap, ctx.block = softcap, block
        seq = q.shape[-2]
        out = torch.empty_like(q)
        for start in range(0, seq, block):
            end = min(start + block, seq)
            out[..., start:end, :] = _block(q[..., start:end, :], k[..., :end, :], v[..., :end, :], start, softcap)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        seq = q.shape[-2]
        for start in range(0, seq, ctx.block):
            end = min(start + ctx.block, seq)
            with torch.enable_grad():
                qb = q[..., start:end, :].detach().requires_grad_()
                kb = k[..., :end, :].detach().requires_grad_()
                vb = v[..., :end, :].detach().requires_grad_()
                out = _block(qb, kb, vb, start, ctx.softcap)
                gq, gk, gv = torch.autograd.grad(out, (qb, kb, vb), grad_out[..., start:end, :])
            dq[..., start:end, :] += gq
            dk[..., :end, :] += gk
            dv[..., :end, :] += gv
        return dq, dk, dv, None, None


def attention(q, k, v, softcap):
    return _BlockedAttention.apply(q, k, v, softcap, 64)
