import math

import torch
from torch.utils.checkpoint import checkpoint

BLOCK = 128          # 每块的查询数：S×S 的矩阵变成 BLOCK×S


def _block(q, k, v, start, softcap):
    """一块查询（从绝对位置 start 开始）对它之前的全部键。"""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    probs = torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1)
    return probs @ v


def attention(q, k, v, softcap):
    """按查询分块，每块包进激活检查点：前向只为反向留下这一块的输入（q、k、v 的视图），
    反向时重算这一块的分数和概率，任何时刻只有一块的 BLOCK×S 矩阵。"""
    seq = q.shape[-2]
    outs = []
    for start in range(0, seq, BLOCK):
        end = min(start + BLOCK, seq)
        outs.append(checkpoint(_block, q[..., start:end, :], k[..., :end, :], v[..., :end, :], start, softcap,
                               use_reentrant=False))
    return torch.cat(outs, dim=-2)
