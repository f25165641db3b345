# expect: too_much_memory|technique
# 反例（半对）：切成 micro-batch、损失也按比例缩放了，却把各块带计算图的损失先存进列表，最后加起来一次 backward。
# 所有块的计算图（和它们保存的激活值）同时活着，和整批一起前向一样多，峰值没有降下来。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    losses = [model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(4)]
    loss = sum(losses)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
