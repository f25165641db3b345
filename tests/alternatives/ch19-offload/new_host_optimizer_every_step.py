# expect: incorrect
# 反例（只做对一半）：在主存里建 AdamW 并把梯度搬过去更新，但每一步都新建主存副本和优化器，
# 一阶矩、二阶矩和步数每步都从零开始，第 2 步起参数更新就和起始代码不同了。
import torch


def train_step(model, optimizer, batch, device):
    params = list(model.parameters())
    hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    with device.host():
        host_params = [device.to_host(p) for p in params]
        host_opt = torch.optim.AdamW(host_params, **hyper)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for hp, p in zip(host_params, params):
        hp.grad = device.to_host(p.grad)
        p.grad = None
    with device.host():
        host_opt.step()
    with torch.no_grad():
        for hp, p in zip(host_params, params):
            p.copy_(device.to_device(hp))
    return loss.item()
