# expect: pass
# 梯度累积，前向自己一层层写：每个 micro-batch（2 个样本）先做词嵌入 + 位置嵌入，再逐个调用 transformer.h 里的
# block，最后 ln_f → lm_head → 模型自带的损失函数。模型和主干的 forward 都没有被调用，经过 block 的还是每个
# micro-batch 各一次前向、一次反向。
import torch


def train_step(model, optimizer, batch, device):
    tr = model.transformer
    n = batch.shape[0]
    positions = torch.arange(batch.shape[1], device=batch.device).unsqueeze(0)
    total = 0.0
    for chunk in batch.split(2):
        hidden = tr.drop(tr.wte(chunk) + tr.wpe(positions))
        for block in tr.h:
            out = block(hidden)
            hidden = out[0] if isinstance(out, tuple) else out
        logits = model.lm_head(tr.ln_f(hidden))
        part = model.loss_function(logits, chunk, vocab_size=model.config.vocab_size) * (chunk.shape[0] / n)
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
