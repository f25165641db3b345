# expect: too_much_memory
# 照抄了卸载的那一行，却包错了地方：前向照常运行，只把 backward 放进 device.save_on_cpu()。
# 为反向保存的张量是在前向里登记的，那时没有卸载钩子，它们全都留在显存里；反向里几乎不再保存张量，
# 这个 with 什么也没搬，峰值与起始代码一样。
import torch


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    with device.save_on_cpu():
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
