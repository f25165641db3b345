# expect: technique
# exercise: ch06-mixed-precision
# 伪造混合精度的另一种写法：前向放在 autocast 里，但每个 block 的 forward 都被 torch.autocast(enabled=False)
# 包住，block 内的矩阵乘法仍是 fp32；只有输出层在 bf16 里算。显存靠梯度累积降下来。
# 旧评分器上（只看顶层模型前向时 autocast 是否打开）：通过。现在：block 权重上的矩阵乘法全是 fp32：technique。
import torch


def train_step(model, optimizer, batch, device):
    for block in model.transformer.h:
        if not hasattr(block, "_fp32"):
            block._fp32 = True
            block.forward = torch.autocast(device.type, enabled=False)(block.forward)
    n = batch.shape[0]
    total = 0.0
    for chunk in batch.split((n + 1) // 2):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        part.backward()
        total += part.item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
