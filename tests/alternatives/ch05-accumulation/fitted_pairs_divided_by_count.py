# expect: incorrect
# 只在 B 是偶数时对：每块 2 行，损失除以块数 len(chunks)。B 为偶数时每块一样大，结果正确；B 为奇数时最后一块
# 只有 1 行，它得到了和 2 行的块一样的权重，梯度不对。
import torch


def train_step(model, optimizer, batch, device):
    chunks = list(batch.split(2))
    total = 0.0
    for chunk in chunks:
        loss = model(input_ids=chunk, labels=chunk).loss / len(chunks)
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
