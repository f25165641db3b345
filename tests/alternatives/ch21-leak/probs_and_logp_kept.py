# expect: pass
# 监控量用 softmax 的概率 probs 和 log 概率 logp 两个局部张量算（都在 no_grad 里），两个都没有 del，活过了 backward()；
# 钩子里记的是 .item()。不是泄漏：它们在函数返回时就释放了，每步结束时显存回到同一个数。
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    with torch.no_grad():
        probs = torch.softmax(out.logits, dim=-1)
        logp = torch.log_softmax(out.logits, dim=-1)
        entropy = -(probs * logp).sum(-1).mean()
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
