# expect: pass
# 用 torch.tensor_split 在主存里把 fc 的行、proj 的列分成 world 份，各 rank 只搬自己那份；
# 部分和全规约之后再加偏置。
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    w1 = device.to_device(torch.tensor_split(fc_weight, world, dim=0)[rank].contiguous())
    b1 = device.to_device(torch.tensor_split(fc_bias, world, dim=0)[rank].contiguous())
    w2 = device.to_device(torch.tensor_split(proj_weight, world, dim=1)[rank].contiguous())
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2)
    dist.all_reduce(y)
    y += device.to_device(proj_bias)
    return y
