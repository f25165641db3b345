# expect: incorrect|exception
# 只对看到的配置成立：把序列按 view 切成 8 块 × 128（假设 seq 是 1024），并把 softcap 写死成 5。
# 可见配置通过；隐藏配置换了序列长度和 softcap，就出错或结果不对。
import math

import torch
from torch.utils.checkpoint import checkpoint


def _block(q, k, v, start):
    scores = 5.0 * torch.tanh(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / 5.0)
    rows = torch.arange(start, start + 128, device=q.device)[:, None]
    cols = torch.arange(k.shape[-2], device=q.device)[None, :]
    return torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1) @ v


def attention(q, k, v, softcap):
    b, h, seq, d = q.shape
    blocks = q.view(b, h, 8, 128, d)
    outs = [checkpoint(_block, blocks[:, :, i], k[..., :(i + 1) * 128, :], v[..., :(i + 1) * 128, :], i * 128,
                       use_reentrant=False) for i in range(8)]
    return torch.cat(outs, dim=-2)
