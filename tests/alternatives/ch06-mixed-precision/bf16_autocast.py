# expect: pass
# bf16 自动混合精度（参考答案的做法）：只有前向和损失在 autocast 里，参数/梯度/优化器状态仍是 fp32。
import torch


def train_step(model, optimizer, batch, device):
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
