# expect: oom
# 只用了一招：数据集留在主存，每次只搬当前 batch。数据集不再占显存，但每个 batch 仍整批一次前向，
# 一步的激活值和 logits 就占了峰值的大半。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = device.to_device(tokens[i:i + batch_size])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
