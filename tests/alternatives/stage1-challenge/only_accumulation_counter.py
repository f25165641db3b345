# expect: oom
# 只用了一招：梯度累积，每个 batch 每 16 行一次前向、反向。激活值只剩一个 micro-batch 那么多，
# 但整个数据集仍然先被搬到了显存里，一直占到 epoch 结束。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    tokens = device.to_device(tokens)
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        total = 0.0
        for row in batch.split(16):
            loss = model(input_ids=row, labels=row).loss * (row.shape[0] / batch.shape[0])
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
