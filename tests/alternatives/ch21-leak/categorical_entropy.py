# expect: pass
# 另一种 API：熵用 torch.distributions.Categorical(logits=...) 算（在 no_grad 里），分布对象 dist 和它归一化后的
# logits 作为局部变量活过了 backward()；钩子里记的是 float(...)。两处都不再连着计算图，每步结束时显存回到同一个数。
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=out.logits)
        mon["entropy_sum"] += float(dist.entropy().mean())
    mon["steps"] += 1
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(float(output.detach().abs().mean()))

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
