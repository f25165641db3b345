# expect: technique
# 反例（方向对了，位置不对）：把低精度放在前向外面，只在反向和优化器更新时打开 autocast。前向照旧全 fp32，
# 为反向保存的激活值一个字节也没少；评分器检查的是模型前向时自动混合精度是否打开。
import torch


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
