# expect: too_much_memory
# 切分抄对了、放错了地方：先把整块权重搬上设备，再在设备上取本 rank 的那一份。
# 切出来的是视图，整块权重照样在每个 rank 的显存里，峰值和起始代码差不多。
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    w1_full, b1_full = device.to_device(fc_weight), device.to_device(fc_bias)
    w2_full = device.to_device(proj_weight)
    k = fc_weight.shape[0] // world
    rows = slice(rank * k, (rank + 1) * k)
    h = F.gelu(F.linear(x, w1_full[rows], b1_full[rows]), approximate="tanh")
    y = F.linear(h, w2_full[:, rows])
    dist.all_reduce(y)
    return y + device.to_device(proj_bias)
