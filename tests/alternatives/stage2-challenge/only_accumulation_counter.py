# expect: oom|too_much_memory
# 只用了上一篇的一招：梯度累积，每次只前向一行。但这个 batch 只有很少几行、每行很长，
# 一行的激活值本身就放不下，累积最多只能把激活值减到几分之一。
import torch


def train_step(model, optimizer, batch, device):
    rows = batch.shape[0]
    total = 0.0
    for row in batch.split(1):
        loss = model(input_ids=row, labels=row).loss / rows
        loss.backward()
        total += loss.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
