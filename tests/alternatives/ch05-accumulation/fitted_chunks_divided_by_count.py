# expect: incorrect
# 只在 B 能被 4 整除时对：切成 4 块（batch.chunk(4)），每块的损失除以块数 4。看到的 B = 16，每块 4 行，一样大，
# 结果正确；B 不能被 4 整除时各块不一样大（例如 13 行切成 4、4、4、1），“除以块数”给小块的权重就太大了，
# 梯度和返回的损失都不对。
import torch


def train_step(model, optimizer, batch, device):
    chunks = batch.chunk(4)
    total = 0.0
    for chunk in chunks:
        loss = model(input_ids=chunk, labels=chunk).loss / len(chunks)
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
