# expect: pass
# 另一种切法：不定 micro-batch 的大小，而是按 token 数定块数（每块约 256 个 token，至少 2 块），用 torch.tensor_split
# 切成大小相差不超过 1 的几块；每块的损失按它的样本数占比加权，这样块不一样大时梯度也和整批相同。
import torch


def train_step(model, optimizer, batch, device):
    n, t = batch.shape
    parts = max(2, min(n, (n * t) // 256))
    total = 0.0
    for chunk in torch.tensor_split(batch, parts):
        part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
