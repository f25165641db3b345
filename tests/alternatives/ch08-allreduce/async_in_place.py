# expect: pass
# 原地、异步：对每个梯度发起 async_op=True 的 AllReduce（不等它完成就发下一个），全部发完再逐个 wait，
# 然后原地除以 rank 数。梯度张量本身就是通信缓冲区，没有额外的拷贝。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    works = [dist.all_reduce(g, async_op=True) for g in grads]
    for w in works:
        w.wait()
    world = dist.get_world_size()
    for g in grads:
        g.div_(world)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
