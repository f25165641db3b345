# expect: pass
# Hugging Face 的开关，不传任何参数：model.gradient_checkpointing_enable()，用它的默认实现。
# 每一步都调用一次（重复调用是安全的），然后照常训练。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable()
    out = model(input_ids=batch, labels=batch)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()
