import torch


def train_step(model, optimizer, batch, device):
    """bf16 自动混合精度：前向放进 torch.autocast，矩阵乘法用 bf16 计算并保存 bf16 激活值；
    参数、梯度和优化器状态仍是 fp32。bf16 的指数范围与 fp32 相同，不需要 GradScaler。"""
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
