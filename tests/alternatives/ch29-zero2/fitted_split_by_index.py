# expect: too_much_memory
# 拟合到可见配置的分片：数过可见模型（6 层）的参数后写死“前 38 个参数（词嵌入、位置嵌入和前 3 个 block）
# 归 rank 0，其余归 rank 1”，在 6 层上两边差不多重。换成层数更少、词表更大的隐藏配置时，rank 0 分到了
# 大部分参数，它的梯度和优化器状态几乎没少，最差那个 rank 的峰值超过目标。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    state = getattr(model, "_zero2", None)
    if state is None:
        world, rank = dist.get_world_size(), dist.get_rank()
        params = list(model.parameters())
        owner = {p: 0 if i < 38 else 1 for i, p in enumerate(params)}
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        local = torch.optim.AdamW([p for p in params if owner[p] == rank], **hyper)

        def hook(p):
            dist.reduce(p.grad, dst=owner[p])
            if owner[p] == rank:
                p.grad /= world
            else:
                p.grad = None

        for p in params:
            p.register_post_accumulate_grad_hook(hook)
        state = model._zero2 = (params, owner, local)
    params, owner, local = state
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    local.step()
    local.zero_grad(set_to_none=True)
    for p in params:
        dist.broadcast(p.data, src=owner[p])
    return loss.item()
