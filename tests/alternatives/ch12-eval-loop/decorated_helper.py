# expect: pass
# 用装饰器关掉自动求导：把单个 batch 的损失写成 @torch.inference_mode() 修饰的辅助函数，
# 返回 Python float；外层只做平均。
import torch


@torch.inference_mode()
def _batch_loss(model, batch):
    return float(model(input_ids=batch, labels=batch).loss)


def evaluate(model, batches, device):
    return sum(_batch_loss(model, b) for b in batches) / len(batches)
