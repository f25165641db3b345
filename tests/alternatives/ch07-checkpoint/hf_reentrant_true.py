# expect: pass
# Hugging Face 自带的激活检查点，旧的 reentrant 实现（use_reentrant=True）。进入每个 block 的隐藏状态
# 来自可训练的嵌入层，本身 requires_grad，且 GPT-2 把它作为位置参数传给 block，所以 reentrant 版本的梯度也完整。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
