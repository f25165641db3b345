# expect: technique
# 伪造梯度累积的省事写法：激活检查点之外，把 batch 切成“除最后一个样本之外的全部”和“最后一个样本”两块，
# 各自前向、反向，形式上是 2 个 micro-batch，显存全靠检查点。旧评分器上：通过。
# 现在：第一块包含整批 94% 的 token（允许不超过 75%）：technique。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n = batch.shape[0]
    total = 0.0
    for chunk in (batch[:-1], batch[-1:]):
        part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
