# expect: incorrect
# 只对看到的配置成立：每个 rank 的那一份写死成 1024 个隐藏单元（看到的 d = 512 时 4d / 2 = 1024）。
# 隐藏配置的宽度更大，两份加起来盖不住所有隐藏单元，结果少了一截。
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    rank = dist.get_rank()
    rows = slice(rank * 1024, (rank + 1) * 1024)
    w1, b1 = device.to_device(fc_weight[rows]), device.to_device(fc_bias[rows])
    w2 = device.to_device(proj_weight[:, rows])
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2)
    dist.all_reduce(y)
    return y + device.to_device(proj_bias)
