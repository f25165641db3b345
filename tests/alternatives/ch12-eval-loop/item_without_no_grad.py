# expect: too_much_memory
# 半个修复：每个损失立刻 .item()，前一个 batch 的激活值在下一个 batch 开始前就释放了，
# 但自动求导仍开着，每个 batch 的前向照样为反向保存全部激活值，峰值还是一个 batch 的整张计算图。
import torch


def evaluate(model, batches, device):
    total = 0.0
    for batch in batches:
        total += model(input_ids=batch, labels=batch).loss.item()
    return total / len(batches)
