# expect: incorrect
# 针对看得到的配置：主存里的 AdamW 用的是照抄来的超参数（lr=1e-3 和默认的 betas、eps、weight_decay），
# 恰好等于看得到的配置里评分器优化器的设置。隐藏配置换了学习率，参数更新就和起始代码对不上了。
import torch


def train_step(model, optimizer, batch, device):
    params = list(model.parameters())
    if not hasattr(model, "_host_adamw"):
        with device.host():
            host_params = [device.to_host(p) for p in params]
            model._host_adamw = (host_params, torch.optim.AdamW(host_params, lr=1e-3, betas=(0.9, 0.999),
                                                                eps=1e-8, weight_decay=1e-2))
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
