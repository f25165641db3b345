# expect: pass
# 另一种加权：每个 micro-batch 的交叉熵用 reduction="sum"（逐 token 相加），再除以整批要预测的 token 总数
# B × (T − 1)。各块的和加起来除以同一个总数，正好是整批的平均损失，不用管每块有几个样本。模型只算 logits
# （不传 labels），错位一格由标签左移、末尾补 -100（忽略）完成。
import torch
import torch.nn.functional as F


def train_step(model, optimizer, batch, device):
    count = batch.shape[0] * (batch.shape[1] - 1)
    total = 0.0
    for chunk in batch.split(2):
        logits = model(input_ids=chunk).logits
        labels = F.pad(chunk[:, 1:], (0, 1), value=-100).reshape(-1)
        part = F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=-100, reduction="sum") / count
        del logits
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
