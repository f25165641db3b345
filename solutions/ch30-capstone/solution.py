import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device, micro_batches=4):
    """三招组合，每招对着一类显存：
    - 激活检查点（第 7 章）：每个 block 只留输入，激活值降一个数量级；
    - 梯度累积（第 5 章）：每次只前向 1/4 个 batch，logits 和交叉熵的临时张量也只有 1/4；
    - 8-bit AdamW（第 19 章，bitsandbytes）：优化器状态从每个参数 8 字节降到约 2 字节。"""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not hasattr(model, "_adamw8bit"):            # 第一次调用时创建，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        model._adamw8bit = bnb.optim.AdamW8bit(model.parameters(), min_8bit_size=0, **hyper)
    opt = model._adamw8bit
    total = 0.0
    for micro in batch.chunk(micro_batches):
        loss = model(input_ids=micro, labels=micro).loss / micro_batches
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total
