# expect: exception|incorrect
# 只适配公开配置：批大小和批数写死成公开配置的 512 行、48 批，没有用 batch_size 和 tokens 的行数。
# 公开配置能过；隐藏配置换了批大小和数据集行数，切法就和起始代码不一样了。
import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    losses = []
    for k in range(48):
        batch = device.to_device(tokens[k * 512:(k + 1) * 512])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
