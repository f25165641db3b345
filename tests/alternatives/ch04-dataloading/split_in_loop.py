# expect: pass
# 另一种写法：tokens.split(batch_size) 在主存里按行切成视图（不复制，最后一块可以不满），
# 循环里只把当前这一块搬到设备上；上一块在下一次赋值时释放。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    losses = []
    for rows in tokens.split(batch_size):
        x = device.to_device(rows)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del x, loss
    return losses
