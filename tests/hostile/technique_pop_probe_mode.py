# expect: tamper
# exercise: ch06-mixed-precision
# 绕过评分器在分发层（dispatch）的观察：torch._C._pop_torch_dispatch_stack 取下栈顶的分发模式（评分器观察方法用的那个），
# fp32 前向（梯度累积降显存）跑完再压回去，然后在 block 的权重上补做一批 bf16 矩阵乘法，凑够“16 位矩阵乘法”的次数。
# 显存计量器（模拟设备）看得到那些运算新建的存储，评分器的模式看不到：两个数对不上，判为干扰计量。
import torch


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    total = 0.0
    for chunk in batch.split((n + 1) // 2):
        mode = torch._C._pop_torch_dispatch_stack(None)
        try:
            part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        finally:
            torch._C._push_on_torch_dispatch_stack(mode)
        part.backward()
        total += part.item()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        x = torch.zeros(1, model.config.n_embd, device=batch.device)
        for _ in range(2):
            for block in model.transformer.h:
                block.attn.c_attn(x)
                block.attn.c_proj(x)
                block.mlp.c_proj(block.mlp.c_fc(x))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
