# expect: exception|incorrect|oom
# 拟合到可见配置的写法：8-bit AdamW 加反向中逐个参数更新，但按可见模型的 8 个 block 写死了下标
# （range(8)），其余参数（嵌入、最后的 LayerNorm）单独更新。隐藏配置的层数不同，这个循环就不成立了。
import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device):
    if not hasattr(model, "_fused"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        per_param = {}
        for i in range(8):
            for p in model.transformer.h[i].parameters():
                per_param[p] = bnb.optim.AdamW8bit([p], min_8bit_size=0, **hyper)
        rest = [p for p in model.parameters() if p not in per_param]
        per_param.update({p: bnb.optim.AdamW8bit([p], min_8bit_size=0, **hyper) for p in rest})

        def step_now(param):
            per_param[param].step()
            per_param[param].zero_grad(set_to_none=True)
        for p in per_param:
            p.register_post_accumulate_grad_hook(step_now)
        model._fused = per_param
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss.item()
