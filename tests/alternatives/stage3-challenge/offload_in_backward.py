# expect: pass
# 另一种组合：优化器状态卸载到主存（主存里一份 FP32 参数和 torch 的 AdamW），再加上反向中的钩子：
# 每个参数的梯度一算完就搬到主存、释放设备上的那份。显存里既没有优化器状态，也没有整份梯度。
import torch


def train_step(model, optimizer, batch, device):
    params = list(model.parameters())
    if not hasattr(model, "_host_state"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        with device.host():
            host = {p: device.to_host(p) for p in params}
            host_optimizer = torch.optim.AdamW(list(host.values()), **hyper)

        def move_grad(param):
            host[param].grad = device.to_host(param.grad)
            param.grad = None
        for p in params:
            p.register_post_accumulate_grad_hook(move_grad)
        model._host_state = (host, host_optimizer)
    host, host_optimizer = model._host_state
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    with device.host():
        host_optimizer.step()
        host_optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in params:
            p.copy_(device.to_device(host[p]))
    return loss.item()
