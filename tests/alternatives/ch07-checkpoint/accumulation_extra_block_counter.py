# expect: technique
# 反例：用梯度累积（每个样本一个 micro-batch）降显存，再在 no_grad 里多调用一次第一个 block，
# 让"block 前向次数多于 block 数 × 模型前向次数"的计数看起来像是有重算。没有任何激活检查点，
# 评分器应当以"没有使用本题要求的方法"判它不通过。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    total = 0.0
    for chunk in batch.split(1):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        loss.backward()
        total += loss.item()
    with torch.no_grad():
        h = model.transformer.wte(batch[:1])
        model.transformer.h[0](h)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
