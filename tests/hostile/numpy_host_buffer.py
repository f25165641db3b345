# expect: exception
# exercise: ch08-allreduce
# 起始代码的扁平梯度缓冲区改在主存里用 numpy 拼：模拟设备上的“显存”张量其实是主存，以前 .numpy() 照样能用，
# 缓冲区就不计显存，第 8 章以 0.83 倍拿满分（多用的 2.6 MiB 主存在 24 MiB 容差以内）。真卡上 .numpy() 报错，
# 模拟设备现在也一样（vramlab/sim/emulation.py HOST_VIEWS）。
# The starter's flat gradient buffer built in host memory through numpy views of the device gradients.
import numpy as np
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.from_numpy(np.concatenate([g.reshape(-1).numpy() for g in grads]))
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
