# expect: pass
# 另一种修法：从 detach() 之后的 logits 算熵，立刻用 float() 取出 Python 数；钩子里记的是断开计算图的
# 0 维张量（每个只占几百字节，不再拉住 MLP 的激活值）。
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    logits = out.logits.detach()                 # 统计量不需要梯度：从断开计算图的 logits 算
    logp = torch.log_softmax(logits, dim=-1)
    mon["entropy_sum"] += float(-(logp.exp() * logp).sum(-1).mean())
    mon["steps"] += 1
    logits = logp = None
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(output.detach().abs().mean())   # 0 维张量，不连计算图

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
