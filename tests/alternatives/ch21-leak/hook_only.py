# expect: oom
# 反例（只修了一半）：只看到了钩子，把钩子里记的数改成 .item()；熵的累加仍然连着计算图，
# 每步留住两份 batch × 序列 × 词表 的张量，在看得到的配置上第 2 步就 OOM。
import torch


def train_step(model, optimizer, batch, device):
    """一步训练，顺带记录两个写日志用的监控量：MLP 激活值的平均幅度（每层一个数）和输出分布的平均熵。
    损失和参数更新都是对的。"""
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    logp = torch.log_softmax(out.logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    mon["entropy_sum"] = mon["entropy_sum"] + entropy
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
