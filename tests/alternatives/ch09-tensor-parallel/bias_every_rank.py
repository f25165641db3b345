# expect: incorrect
# 每个 rank 都在全规约之前把 proj_bias 加进部分和：全规约把 world 份偏置也加了起来，结果差一个偏置。
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    k = fc_weight.shape[0] // world
    rows = slice(rank * k, (rank + 1) * k)
    w1, b1 = device.to_device(fc_weight[rows]), device.to_device(fc_bias[rows])
    w2, b2 = device.to_device(proj_weight[:, rows]), device.to_device(proj_bias)
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
    dist.all_reduce(y)
    return y
