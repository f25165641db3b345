import torch


def train_epoch(model, optimizer, tokens, device, batch_size, micro_rows=32):
    """两招组合，各对着一类显存：
    - 数据留在主存（第 4 章）：每次只把当前 batch 搬到设备上，用完就释放；
    - 梯度累积（第 5 章）：一个 batch 分成几个 micro-batch 前向、反向，损失按行数加权，
      激活值只有一个 micro-batch 那么多；每个 batch 仍只做一次 optimizer.step()。"""
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = device.to_device(tokens[i:i + batch_size])
        rows = batch.shape[0]
        total = 0.0
        for micro in batch.split(micro_rows):
            loss = model(input_ids=micro, labels=micro).loss * (micro.shape[0] / rows)
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
