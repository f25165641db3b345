# expect: too_much_memory
# 反例（照抄了“逐个参数 AllReduce”，但没做到原地）：先把每个梯度 clone 一份放进列表，逐个 AllReduce 这些副本，
# 再拷回 .grad。通信确实是逐个参数的，但所有副本同时活着，加起来又是一整份梯度，和扁平缓冲区一样多。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    copies = [p.grad.clone() for p in model.parameters()]
    for c in copies:
        dist.all_reduce(c)
        c /= world
    for p, c in zip(model.parameters(), copies):
        p.grad.copy_(c)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
