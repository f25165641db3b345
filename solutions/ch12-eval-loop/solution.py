import torch


def evaluate(model, batches, device):
    """评估不需要反向：inference_mode 下前向不为反向保存激活值；
    每个 batch 的损失立刻变成 Python float，张量随即释放。"""
    total = 0.0
    with torch.inference_mode():
        for batch in batches:
            total += model(input_ids=batch, labels=batch).loss.item()
    return total / len(batches)
