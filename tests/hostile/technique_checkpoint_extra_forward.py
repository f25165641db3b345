# expect: technique
# 伪造梯度累积：其实用的是激活检查点（本题单用检查点约 0.71 倍，低于 0.75 的目标），整批一次前向、反向，
# 再在 no_grad 里拿一个样本多调用一次模型，让“每步模型前向至少 2 次”的计数满足。
# 旧评分器（数顶层模型的前向次数）上：通过。现在：评分器在 block 的权重上数每次前向相乘的 token，
# 整批一起经过了 block，而且只有一次“前向之后接反向”：technique。
import torch


def train_step(model, optimizer, batch, device):
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    with torch.no_grad():
        model(input_ids=batch[:1])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
