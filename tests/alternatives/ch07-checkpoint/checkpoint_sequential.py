# expect: pass
# torch.utils.checkpoint.checkpoint_sequential：自己写 GPT-2 的前向（词嵌入 + 位置嵌入 → 各个 block →
# ln_f → lm_head → 模型自带的损失函数），把 transformer.h 里的 block 当作一个序列，每个 block 一段。
# （checkpoint_sequential 的最后一段不做检查点，直接运行。）GPT-2 block 不传掩码时用因果注意力，
# 和模型自己的前向相同。
import torch
from torch.utils.checkpoint import checkpoint_sequential


def train_step(model, optimizer, batch, device):
    tr = model.transformer
    positions = torch.arange(batch.shape[1], device=batch.device).unsqueeze(0)
    hidden = tr.drop(tr.wte(batch) + tr.wpe(positions))
    hidden = checkpoint_sequential(tr.h, len(tr.h), hidden, use_reentrant=False)
    logits = model.lm_head(tr.ln_f(hidden))
    loss = model.loss_function(logits, batch, vocab_size=model.config.vocab_size)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
