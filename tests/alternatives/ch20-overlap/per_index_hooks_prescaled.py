# expect: pass
# 另一种写法：按参数的序号建各自的 AdamW（超参数从评分器优化器的 param_groups 读），钩子用闭包记住序号；
# 先把梯度除以 rank 数再求和（与先求和再除相同）。第一次调用时挂好，之后复用。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    if not getattr(model, "_fused_hooks_ready", False):
        group = optimizer.param_groups[0]
        hyper = dict(lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"])
        world = dist.get_world_size()
        params = list(model.parameters())
        opts = [torch.optim.AdamW([p], **hyper) for p in params]

        def make_hook(i):
            def hook(p):
                p.grad.div_(world)
                dist.all_reduce(p.grad)
                opts[i].step()
                p.grad = None
            return hook

        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(make_hook(i))
        model._fused_opts = opts
        model._fused_hooks_ready = True
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item()
