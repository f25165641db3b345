import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    """数据集留在主存，每次只把当前这个 batch 搬到显存；用完它就被释放。"""
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = device.to_device(tokens[i:i + batch_size])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
