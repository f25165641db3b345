# expect: pass
# 隐藏单元按步长交错分给各 rank（rank r 取第 r、r+world、r+2·world… 个），不是连续的一段；
# proj_bias 只由 rank 0 在全规约之前加进自己的部分和，全规约后正好加了一次。
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    w1 = device.to_device(fc_weight[rank::world].contiguous())
    b1 = device.to_device(fc_bias[rank::world].contiguous())
    w2 = device.to_device(proj_weight[:, rank::world].contiguous())
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2)
    del w1, b1, w2
    if rank == 0:
        y = y + device.to_device(proj_bias)
    dist.all_reduce(y)
    return y
