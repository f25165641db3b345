# expect: incorrect
# 反例（照抄了“切分优化器状态”的那一行，放错了地方）：每次调用 train_step 都新建一个只含本 rank 那份参数的
# AdamW。每步都从空的一阶矩、二阶矩开始，AdamW 的状态没有跨步保留，第二步起的更新就和起始代码不同了。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    world, rank = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    owners, seen = [], 0
    for p in params:
        owners.append(min(world - 1, seen * world // total))
        seen += p.numel()
    hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    shard_opt = torch.optim.AdamW([p for p, o in zip(params, owners) if o == rank], **hyper)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= world
    shard_opt.step()
    for p, owner in zip(params, owners):
        dist.broadcast(p.data, src=owner)
    for p in params:
        p.grad = None
    return loss.item()
