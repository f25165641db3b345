# expect: exception
# exercise: ch08-allreduce
# 同 numpy_host_buffer，但经 DLPack（np.from_dlpack）取主存视图。
# numpy_host_buffer through DLPack views instead of numpy().
import numpy as np
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.from_numpy(np.concatenate([np.from_dlpack(g.reshape(-1)) for g in grads]))
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
