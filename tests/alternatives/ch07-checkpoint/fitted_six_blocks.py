# expect: exception
# 只对看到的层数成立：手写包装时把 block 的下标写死成 range(6)（看到的模型正好 6 层），逐个换成
# checkpoint 包住的 forward。看到的配置能通过；隐藏配置的层数不同，写死的下标就对不上了。
import functools

import torch
from torch.utils.checkpoint import checkpoint


def train_step(model, optimizer, batch, device):
    if not getattr(model, "_wrapped", False):
        for i in range(6):
            block = model.transformer.h[i]
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
        model._wrapped = True
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
