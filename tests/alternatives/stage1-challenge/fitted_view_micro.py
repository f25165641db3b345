# expect: exception|incorrect
# 拟合到可见配置的写法：数据流式搬运、梯度累积都做了，但 micro-batch 是按可见的 batch 形状
# （128 行 × 128 个 token）用 view(4, 32, 128) 切出来的，损失除以 4。隐藏配置的批大小不同、最后一个 batch 不满，
# 这个 view 就不成立了。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = device.to_device(tokens[i:i + batch_size])
        total = 0.0
        for micro in batch.view(4, 32, 128):
            loss = model(input_ids=micro, labels=micro).loss / 4
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
