import torch


def train_step(model, optimizer, batch, device):
    """优化器状态卸载（ZeRO-Offload 的做法）：主存里放一份 FP32 参数和 AdamW，
    梯度搬到主机、在主机上更新，再把新参数拷回显存。AdamW 的状态从不进显存。"""
    params = list(model.parameters())
    if not hasattr(model, "_host_adamw"):          # 第一次调用时创建，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "foreach")}
        with device.host():
            host_params = [device.to_host(p) for p in params]
            model._host_adamw = (host_params, torch.optim.AdamW(host_params, **hyper))
    host_params, host_optimizer = model._host_adamw
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for hp, p in zip(host_params, params):
        hp.grad = device.to_host(p.grad)
        p.grad = None                               # 梯度搬走就释放
    with device.host():
        host_optimizer.step()                       # 状态和临时张量都在主存里
        host_optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for hp, p in zip(host_params, params):
            p.copy_(device.to_device(hp))
    return loss.item()
