# expect: incorrect
# 只对看到的配置成立：inference_mode 用对了，但平均时除以写死的 4（看到的 batch 数）。
# 隐藏配置的 batch 数不同，平均损失就错了。
import torch


def evaluate(model, batches, device):
    total = 0.0
    with torch.inference_mode():
        for batch in batches:
            total += model(input_ids=batch, labels=batch).loss.item()
    return total / 4
