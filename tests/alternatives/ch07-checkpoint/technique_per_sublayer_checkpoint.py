# expect: pass
# 按子层做检查点：每个 block 里的注意力（block.attn）和 MLP（block.mlp）各自包进 checkpoint（非 reentrant），
# 两个 LayerNorm 和残差加法照常运行。反向时注意力和 MLP 内部的激活值（q/k/v、4 倍宽的隐藏层……）重新计算；
# 为反向保存的只剩子层的输入（LayerNorm 的输出）和残差，比整块检查点多一点，但远少于起始代码。
import torch
from torch.utils.checkpoint import checkpoint


def train_step(model, optimizer, batch, device):
    for block in model.transformer.h:
        for sub in (block.attn, block.mlp):
            if not hasattr(sub, "_plain_forward"):
                sub._plain_forward = sub.forward
                sub.forward = lambda *a, _f=sub._plain_forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
