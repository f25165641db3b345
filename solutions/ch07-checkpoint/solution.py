import torch


def train_step(model, optimizer, batch, device):
    """激活检查点：每个 block 只保存输入，反向时重新计算 block 内部的激活值。
    gradient_checkpointing_enable 对同一个模型重复调用是安全的。"""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
