# expect: technique
# 反例：纯 bf16 训练。把模型（参数）整体转成 bf16，优化器状态于是也建成 bf16，前向仍放在 autocast 里
# （所以"前向在 autocast 里"这一条是满足的）。显存确实降了，但这不是本题要求的混合精度：
# 参数、梯度和优化器状态应当保持 fp32。评分器应当以"没有使用本题要求的方法"判它不通过。
import torch


def train_step(model, optimizer, batch, device):
    if next(model.parameters()).dtype != torch.bfloat16:
        model.to(torch.bfloat16)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.float().item()
