import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def train_step(model, optimizer, batch, device):
    """ZeRO-1：每个 rank 只为自己负责的那一份参数保存 AdamW 状态、只更新那一份，
    然后把更新后的参数广播给其他 rank。第一次调用时创建，之后每步复用。"""
    zero = getattr(model, "_zero_optimizer", None)
    if zero is None:
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(optimizer), **hyper)
        model._zero_optimizer = zero
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    zero.step()
    zero.zero_grad(set_to_none=True)
    return loss.item()
