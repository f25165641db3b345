# expect: pass
# 自己写前向循环，每两个相邻的 block 合成一段做检查点（层数是奇数时最后一段只有一个 block）：
# 词嵌入 + 位置嵌入 → 每段 checkpoint(两个 block) → ln_f → lm_head → 模型自带的损失函数。
# 段数少一半，每段为反向只保存它的输入；反向时一次重算两个 block，同一时刻活着的重算激活值多一倍。
import torch
from torch.utils.checkpoint import checkpoint


def _run(blocks, hidden):
    for block in blocks:
        out = block(hidden)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def train_step(model, optimizer, batch, device):
    tr = model.transformer
    positions = torch.arange(batch.shape[1], device=batch.device).unsqueeze(0)
    hidden = tr.drop(tr.wte(batch) + tr.wpe(positions))
    blocks = list(tr.h)
    for i in range(0, len(blocks), 2):
        hidden = checkpoint(_run, blocks[i:i + 2], hidden, use_reentrant=False)
    logits = model.lm_head(tr.ln_f(hidden))
    loss = model.loss_function(logits, batch, vocab_size=model.config.vocab_size)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
