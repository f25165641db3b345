# expect: technique
# 反例（半对）：只给第一个 block 做检查点，其余 block 照常保存激活值。反向时确实有重算，但 block 前向为反向
# 保存的字节数仍是起始代码的大半，峰值也降得很少；评分器要求 block 内保存的字节不超过起始代码的 60%。
import torch
from torch.utils.checkpoint import checkpoint


def train_step(model, optimizer, batch, device):
    first = model.transformer.h[0]
    if not hasattr(first, "_plain_forward"):
        first._plain_forward = first.forward
        first.forward = lambda *a, **k: checkpoint(first._plain_forward, *a, use_reentrant=False, **k)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
