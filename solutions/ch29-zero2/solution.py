import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """ZeRO-2（DeepSpeed 的 stage 2）：每个参数归一个 rank 所有。梯度一算好就归约到它的所有者，
    其他 rank 立刻释放这份梯度；所有者用自己的 AdamW 更新，再把新参数广播出去。"""
    state = getattr(model, "_zero2", None)
    if state is None:                                    # 第一次调用：分片、建优化器、挂钩子
        world, rank = dist.get_world_size(), dist.get_rank()
        params = list(model.parameters())
        owner, load = {}, [0] * world
        for p in sorted(params, key=lambda q: -q.numel()):   # 按大小贪心分片，各 rank 负担接近
            owner[p] = load.index(min(load))
            load[owner[p]] += p.numel()
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        mine = [p for p in params if owner[p] == rank]
        local = torch.optim.AdamW(mine, **hyper)

        def reduce_to_owner(p):
            dist.reduce(p.grad, dst=owner[p])            # 求和只送到所有者那里
            if owner[p] == rank:
                p.grad /= world
            else:
                p.grad = None                            # 不归我管的梯度：立刻释放

        for p in params:
            p.register_post_accumulate_grad_hook(reduce_to_owner)
        state = model._zero2 = (params, owner, local)
    params, owner, local = state
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    local.step()
    local.zero_grad(set_to_none=True)
    for p in params:                                     # 所有者把更新后的参数发给其他 rank
        dist.broadcast(p.data, src=owner[p])
    return loss.item()
