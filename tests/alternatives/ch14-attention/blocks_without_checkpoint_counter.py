# expect: too_much_memory
# 半个修法：按 128 个查询分块，但不加检查点。每一块的 tanh 输出和概率都被保存到反向，
# 因果掩码让后面的块更宽，合起来仍约是整张矩阵的一半，峰值超出目标。
import math

import torch


def attention(q, k, v, softcap):
    seq = q.shape[-2]
    outs = []
    for start in range(0, seq, 128):
        end = min(start + 128, seq)
        scores = q[..., start:end, :] @ k[..., :end, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = softcap * torch.tanh(scores / softcap)
        rows = torch.arange(start, end, device=q.device)[:, None]
        cols = torch.arange(end, device=q.device)[None, :]
        probs = torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1)
        outs.append(probs @ v[..., :end, :])
    return torch.cat(outs, dim=-2)
