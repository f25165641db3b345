# expect: too_much_memory
# 反例：把“每个 batch 单独搬”这一行放错了地方：循环之前就把每个 batch 都搬到设备上存进列表，
# 所有 batch 在整个 epoch 里都在显存里，和一次搬整个数据集没有区别。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    batches = [device.to_device(tokens[i:i + batch_size]) for i in range(0, tokens.shape[0], batch_size)]
    losses = []
    for batch in batches:
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
