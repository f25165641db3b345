# expect: incorrect
# 只对看到的批大小成立：每块 4 个样本，损失一律除以 4（看到的 batch 是 16，正好 4 块）。
# 隐藏配置的批大小不同，块数不再是 4（最后一块也可能更小），梯度和返回的损失都不对了。
import torch


def train_step(model, optimizer, batch, device):
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss / 4
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
