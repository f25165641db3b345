# expect: too_much_memory
# 抄对了那一句、放错了地方：只把最后的求平均放进 torch.no_grad()。损失张量在循环里已经带着计算图存下，
# 关掉自动求导时激活值早就都保存好了，峰值和起始代码一样。
import torch


def evaluate(model, batches, device):
    losses = []
    for batch in batches:
        losses.append(model(input_ids=batch, labels=batch).loss)
    with torch.no_grad():
        return torch.stack(losses).mean().item()
