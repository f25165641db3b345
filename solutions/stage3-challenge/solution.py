import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device):
    """两招组合，分别对着两类模型状态：
    - 8-bit AdamW（第 19 章）：优化器状态从每个参数 8 字节降到约 2 字节；
    - 反向中逐个参数更新（第 19 章）：某个参数的梯度一算完就更新它并释放梯度，
      显存里同时只有少数几个参数的梯度，而不是全部。"""
    if not hasattr(model, "_fused_8bit"):           # 第一次调用时创建，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        per_param = {}
        for p in model.parameters():
            per_param[p] = bnb.optim.AdamW8bit([p], min_8bit_size=0, **hyper)

            def step_now(param):
                opt = per_param[param]
                opt.step()
                opt.zero_grad(set_to_none=True)
            p.register_post_accumulate_grad_hook(step_now)
        model._fused_8bit = per_param
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()                                 # 每个参数在反向中各自更新
    return loss.item()
