# expect: oom|too_much_memory
# 只用了一招：每个参数的梯度一算完就用它自己的 torch AdamW 更新并释放，显存里不再同时有全部梯度；
# 但每个参数 8 字节的 FP32 优化器状态原封不动，参数加状态已经超出这张卡。
import torch


def train_step(model, optimizer, batch, device):
    if not hasattr(model, "_per_param"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        per_param = {p: torch.optim.AdamW([p], **hyper) for p in model.parameters()}

        def step_now(param):
            per_param[param].step()
            per_param[param].zero_grad(set_to_none=True)
        for p in per_param:
            p.register_post_accumulate_grad_hook(step_now)
        model._per_param = per_param
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item()
