import torch


def train_step(model, optimizer, batch, device):
    """梯度累积：把 batch 切成 micro-batch，逐个前向、反向，梯度在 .grad 里累加，
    最后只做一次 optimizer.step()。每个 micro-batch 的损失按它占整个 batch 的比例缩放
    （最后一块可能更小），累加出来的梯度就和整个 batch 一起算的完全相同。"""
    micro_batch = 2
    total = 0.0
    n = batch.shape[0]
    for chunk in batch.split(micro_batch):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        loss.backward()
        total += loss.item()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
