# expect: pass
# 用 torch.chunk 把 INT8 权重按输出通道切成 16 份（缩放系数同样切），每份反量化、相乘、乘缩放系数，
# 各份输出存进列表，最后 torch.cat 拼成完整输出。拼接时输出短暂有两份，但输出远小于权重。
import torch


def int8_linear(x, weight_int8, scale):
    parts = []
    for q, s in zip(torch.chunk(weight_int8, 16, dim=0), torch.chunk(scale, 16, dim=0)):
        parts.append((x @ q.to(x.dtype).T) * s)
    return torch.cat(parts, dim=1)
