# expect: incorrect|exception
# 拟合到可见配置的写法：把可见的 batch 形状（8 行、序列长度 128）写死，用 view(4, 2, 128) 切出 4 个
# 微批次，损失除以 4。可见配置上它与参考答案完全一样；隐藏配置的批大小和序列长度不同，这个 view 就不成立了。
import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not hasattr(model, "_adamw8bit"):
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        model._adamw8bit = bnb.optim.AdamW8bit(model.parameters(), min_8bit_size=0, **hyper)
    opt = model._adamw8bit
    total = 0.0
    for micro in batch.view(4, 2, 128):
        loss = model(input_ids=micro, labels=micro).loss / 4
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total
