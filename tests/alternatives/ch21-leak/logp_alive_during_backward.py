# expect: pass
# 两处泄漏都修好了，但熵是从 detach() 之后的 logits 算的，log_softmax 的结果 logp 作为普通局部变量一直活到
# backward() 之后（没有 del）。它只是这一步里多活了一会儿的一个局部张量，不是泄漏：每步结束时已分配显存照样回到
# 同一个数。隐藏配置的显卡要给这种普通写法留出余地。
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    logp = torch.log_softmax(out.logits.detach(), dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    mon["entropy_sum"] += entropy.item()
    mon["steps"] += 1
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(output.detach().abs().mean().item())

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
