# expect: oom|too_much_memory
# 只用了一招：8-bit AdamW 把优化器状态压到每个参数约 2 字节，但反向结束时全部参数的 FP32 梯度
# 仍然同时在显存里，再加上参数本身，这张卡还是放不下。
import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device):
    if not hasattr(model, "_adamw8bit"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        model._adamw8bit = bnb.optim.AdamW8bit(model.parameters(), min_8bit_size=0, **hyper)
    opt = model._adamw8bit
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()
