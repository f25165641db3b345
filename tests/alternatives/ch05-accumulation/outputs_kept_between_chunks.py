# expect: pass
# 普通的局部变量不删：每块的模型输出 out（带着 logits）一直留到下一块的前向结束才被覆盖，这块的损失张量也留着。
# 反向已经释放了计算图，留下的只是一块 logits 的大小；用不均匀的块（先切 5 行，剩下的每块 5 行）。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    total = 0.0
    start = 0
    while start < n:
        rows = batch[start:start + 5]
        out = model(input_ids=rows, labels=rows)
        scaled = out.loss * rows.shape[0] / n
        scaled.backward()
        total += scaled.item()
        start += rows.shape[0]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
