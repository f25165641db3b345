# expect: technique
# 反例：只用激活检查点。峰值也降到了目标以下，但本题练的是卸载：测量的那一步没有任何张量搬到主存。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
