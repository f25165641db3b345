# expect: too_much_memory
# 针对看得到的配置：只有 batch 的形状正好是看得到的那个（每个 rank 1 × 64）时才走“梯度算好就更新、就释放”
# 的路径，其他形状退回起始代码的做法。隐藏配置换了序列长度，峰值就回到了起始代码的水平。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    world = dist.get_world_size()
    if tuple(batch.shape) == (1, 64):
        if not hasattr(model, "_per_param"):
            hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
            per_param = {p: torch.optim.AdamW([p], **hyper) for p in model.parameters()}

            def hook(p):
                dist.all_reduce(p.grad)
                p.grad /= world
                per_param[p].step()
                p.grad = None

            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)
            model._per_param = per_param
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        return loss.item()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
