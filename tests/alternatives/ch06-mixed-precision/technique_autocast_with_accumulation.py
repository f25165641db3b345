# expect: pass
# 混合精度再加梯度累积：每个 micro-batch（半个 batch）的前向和损失都在 bf16 autocast 里，各自反向，梯度在 fp32 的
# .grad 里累加，最后一次 optimizer.step()。两种方法叠加，峰值比单用混合精度更低；混合精度这一条照样满足：
# block 里的矩阵乘法是 bf16，参数、梯度、优化器状态是 fp32。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    total = 0.0
    for chunk in batch.split((n + 1) // 2):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
