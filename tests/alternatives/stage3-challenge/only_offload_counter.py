# expect: oom|too_much_memory
# 只用了一招：AdamW 的状态整份放进主存（ZeRO-Offload 的做法），显存里没有优化器状态了；
# 但梯度要等反向全部结束才搬走，那一刻参数加全部梯度仍然超出这张卡。
import torch


def train_step(model, optimizer, batch, device):
    params = list(model.parameters())
    if not hasattr(model, "_host_adamw"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        with device.host():
            host_params = [device.to_host(p) for p in params]
            model._host_adamw = (host_params, torch.optim.AdamW(host_params, **hyper))
    host_params, host_optimizer = model._host_adamw
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for hp, p in zip(host_params, params):
        hp.grad = device.to_host(p.grad)
        p.grad = None
    with device.host():
        host_optimizer.step()
        host_optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for hp, p in zip(host_params, params):
            p.copy_(device.to_device(hp))
    return loss.item()
