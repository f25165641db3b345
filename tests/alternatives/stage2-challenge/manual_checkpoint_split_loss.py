# expect: pass
# 另一种写法：激活检查点自己写（torch.utils.checkpoint 包住每个 block 的 forward，非 reentrant）；
# 损失按 token 切成大约 4 段（段数固定、每段长度由实际 token 数算出），每段的输出层和交叉熵也包进检查点，
# 各段的损失加起来再除以 token 总数。
import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _piece(h, w, y):
    return F.cross_entropy(F.linear(h, w), y, reduction="sum")


def train_step(model, optimizer, batch, device):
    if not getattr(model, "_wrapped", False):
        for block in model.transformer.h:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
        model._wrapped = True
    hidden = model.transformer(input_ids=batch).last_hidden_state
    hidden = hidden[:, :-1].flatten(0, 1)
    targets = batch[:, 1:].flatten()
    total = sum(checkpoint(_piece, h, model.lm_head.weight, y, use_reentrant=False)
                for h, y in zip(hidden.tensor_split(4), targets.tensor_split(4)))
    loss = total / targets.numel()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
