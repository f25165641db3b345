# expect: technique
# 反例：照抄“整个前向包进 save_on_cpu()”那一行。峰值确实最低，但参数（本来就常驻显存）、输出层和损失
# 为反向保存的张量也被搬了一趟：每步搬到主存的数据超出本题允许的量。
import torch


def train_step(model, optimizer, batch, device):
    with device.save_on_cpu():
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
