# expect: pass
# 固定切成 4 块（batch.chunk(4)），块的大小可以不一样（B 不能被 4 整除时最后一块更小，甚至只剩 3 块）；
# 每块的损失按“这一块的样本数 ÷ 整批样本数”加权，所以不管怎么切，累加出来的梯度都和整批一起算的相同。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    total = 0.0
    for chunk in batch.chunk(4):
        loss = model(input_ids=chunk, labels=chunk).loss * (len(chunk) / n)
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
