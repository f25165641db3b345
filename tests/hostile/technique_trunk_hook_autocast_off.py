# expect: technique
# exercise: ch06-mixed-precision
# 伪造混合精度：模型的前向放在 autocast 里（旧评分器在顶层模型的前向钩子里看到 autocast 是开着的），
# 主干 model.transformer 上挂一个前向预钩子把 autocast 关掉、前向钩子再打开，于是所有 block 照旧 fp32 计算；
# 显存靠梯度累积（两个 micro-batch）降下来。旧评分器上：方法判为混合精度，通过。
# 现在：评分器在 block 的权重上看每次矩阵乘法实际的 dtype，全是 fp32：technique。
import torch


def train_step(model, optimizer, batch, device):
    trunk = model.transformer
    if not hasattr(trunk, "_fp32_hooks"):
        trunk._fp32_hooks = (
            trunk.register_forward_pre_hook(lambda m, a: torch.set_autocast_enabled(device.type, False)),
            trunk.register_forward_hook(lambda m, a, o: torch.set_autocast_enabled(device.type, True)),
        )
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
