# expect: pass
# 更进一步的写法：每个参数在主存里有自己的 FP32 副本和 AdamW（超参数从评分器优化器的 param_groups 读），
# 反向中某个参数的梯度一累加完，钩子就把它搬到主存、释放设备上的那份、在主存里更新并把新值拷回。
# 显存里从不同时存在整份梯度，也没有任何优化器状态。
import torch


def train_step(model, optimizer, batch, device):
    if not hasattr(model, "_offload_hooks"):
        group = optimizer.param_groups[0]
        hyper = dict(lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"])
        host = {}
        with device.host():
            for p in model.parameters():
                hp = device.to_host(p)
                host[p] = (hp, torch.optim.AdamW([hp], **hyper))

        def offload_and_step(p):
            hp, opt = host[p]
            hp.grad = device.to_host(p.grad)
            p.grad = None
            with device.host():
                opt.step()
                opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                p.copy_(device.to_device(hp))

        model._offload_hooks = [p.register_post_accumulate_grad_hook(offload_and_step) for p in model.parameters()]
        model._offload_host = host
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item()
