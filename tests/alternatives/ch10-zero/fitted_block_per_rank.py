# expect: incorrect|too_much_memory
# 只对看到的模型成立：按名字切分，“第 i 个 Transformer block 归 rank i”，词嵌入、位置嵌入和最后的 LayerNorm 归
# rank 0。看到的模型正好 2 层、2 个 rank，这样切两个 rank 都分到了参数（rank 0 约 2/3），能通过；
# 隐藏配置的层数不同，按层号对应 rank 的切法就失衡了：层数少于 rank 数时，有的 rank 一份也分不到，
# 最差那个 rank 存着几乎全部的优化器状态，分不到参数的 rank 也就没有优化器可以 step。
import torch
import torch.distributed as dist


def _owner(name):
    parts = name.split(".")
    return int(parts[2]) if parts[1] == "h" else 0


def train_step(model, optimizer, batch, device):
    rank = dist.get_rank()
    named = list(model.named_parameters())
    state = getattr(model, "_zero_by_block", None)
    if state is None:
        owners = [_owner(n) for n, _ in named]
        mine = [p for (_, p), o in zip(named, owners) if o == rank]
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        shard_opt = torch.optim.AdamW(mine, foreach=True, **hyper) if mine else None
        state = model._zero_by_block = (owners, shard_opt)
    owners, shard_opt = state
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for _, p in named:
        dist.all_reduce(p.grad)
        p.grad /= world
    if shard_opt is not None:
        shard_opt.step()
    for (_, p), owner in zip(named, owners):
        dist.broadcast(p.data, src=owner)
    for _, p in named:
        p.grad = None
    return loss.item()
