import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    """Megatron 式张量并行：fc 按输出维切（列并行），proj 按输入维切（行并行）。
    每个 rank 只搬自己的那一份权重，算出部分和，一次 all_reduce 得到完整输出。"""
    rank, world = dist.get_rank(), dist.get_world_size()
    part = fc_weight.shape[0] // world
    rows = slice(rank * part, (rank + 1) * part)
    w1, b1 = device.to_device(fc_weight[rows]), device.to_device(fc_bias[rows])
    w2 = device.to_device(proj_weight[:, rows])
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")      # GELU 逐元素：切开后各算各的
    y = F.linear(h, w2)                                        # 部分和
    dist.all_reduce(y)                                         # 求和，得到完整输出
    return y + device.to_device(proj_bias)                     # 偏置只加一次
