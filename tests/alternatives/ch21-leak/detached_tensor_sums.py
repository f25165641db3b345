# expect: pass
# 监控量仍然留成张量，只是断开了计算图：熵累加的是 entropy.detach()，钩子里存的是 0 维的 detach 张量。它们每个只占
# 几百字节、不拉住任何激活值，写日志时再 .item() 即可。熵在 backward() 之后才算（此时 logits 还在 out 里）。
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    logits = out.logits.detach()
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    mon["entropy_sum"] = mon["entropy_sum"] + entropy.detach()
    mon["steps"] += 1
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(output.detach().abs().mean())

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
