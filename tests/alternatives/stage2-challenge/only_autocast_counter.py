# expect: oom|too_much_memory
# 只用了一招：BF16 autocast 让大部分激活值变成 2 字节一个数，但每一层为反向保存的中间结果
# 一个都没少（还多了几份 FP32 的残差和 LayerNorm 输入），这张卡还是放不下。
import torch


def train_step(model, optimizer, batch, device):
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
