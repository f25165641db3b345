# expect: incorrect
# 反例（把累积写成了多次更新）：每个 micro-batch 反向之后就 optimizer.step()、zero_grad()。显存确实降了，
# 但一次调用做了好几次参数更新，用的都是小批量的梯度，和整批一次更新的结果不同。
import torch


def train_step(model, optimizer, batch, device):
    total = 0.0
    for chunk in batch.split(4):
        loss = model(input_ids=chunk, labels=chunk).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total += loss.item() * chunk.shape[0] / batch.shape[0]
    return total
