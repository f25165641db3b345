# expect: pass
# torch.distributed.optim.ZeroRedundancyOptimizer（题目允许）：第一次调用时用评分器给的优化器的类和
# 超参数创建，存在模型上，之后每步复用；梯度先求平均，再由它只更新本 rank 的那一份并同步参数。
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def train_step(model, optimizer, batch, device):
    zero = getattr(model, "_zero", None)
    if zero is None:
        zero = model._zero = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=type(optimizer),
            **{k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "foreach")})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    zero.step()
    zero.zero_grad(set_to_none=True)
    return loss.item()
