# expect: pass
# 另一种写法：每个 batch 只把当前要算的那几行从主存搬到设备上（搬运和累积合在一个循环里），
# 每次最多 24 行，损失按行数加权；整个数据集和整个 batch 都不同时出现在设备上。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    n = tokens.shape[0]
    losses = []
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        total = 0.0
        for lo in range(start, stop, 24):
            rows = device.to_device(tokens[lo:min(lo + 24, stop)])
            loss = model(input_ids=rows, labels=rows).loss * (rows.shape[0] / (stop - start))
            loss.backward()
            total += loss.item()
            del rows, loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
