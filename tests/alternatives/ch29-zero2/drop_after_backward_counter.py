# expect: too_much_memory
# 半个修复：分片和 reduce 都对，但等整个反向结束后才对每个参数 reduce、丢掉不归自己管的梯度。
# 结果正确，可峰值就在反向结束的那一刻：那时每个 rank 仍然同时握着全部梯度，与 ZeRO-1 一样。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    state = getattr(model, "_zero2", None)
    if state is None:
        world, rank = dist.get_world_size(), dist.get_rank()
        params = list(model.parameters())
        owner, load = {}, [0] * world
        for p in sorted(params, key=lambda q: -q.numel()):
            owner[p] = load.index(min(load))
            load[owner[p]] += p.numel()
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        local = torch.optim.AdamW([p for p in params if owner[p] == rank], **hyper)
        state = model._zero2 = (params, owner, local)
    params, owner, local = state
    world, rank = dist.get_world_size(), dist.get_rank()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for p in params:                       # too late: every gradient is already alive here
        dist.reduce(p.grad, dst=owner[p])
        if owner[p] == rank:
            p.grad /= world
        else:
            p.grad = None
    local.step()
    local.zero_grad(set_to_none=True)
    for p in params:
        dist.broadcast(p.data, src=owner[p])
    return loss.item()
