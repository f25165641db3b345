# expect: pass
# 题目允许的“固定的小缓冲区”：预先分配一块 64 Ki 个元素（256 KiB，与模型大小无关）的缓冲区，存在模型上、跨步复用；
# 梯度按顺序塞进它，满了就 AllReduce、除以 rank 数、拷回，再接着塞；比缓冲区大的梯度直接原地 AllReduce。
# 缓冲区一直活着，包括 optimizer.step() 的时候（峰值就在那里），所以比值比原地 AllReduce 高出它的大小。
import torch
import torch.distributed as dist

ELEMENTS = 64 * 1024


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    if not hasattr(model, "_comm_buffer"):
        p0 = next(model.parameters())
        model._comm_buffer = torch.empty(ELEMENTS, dtype=p0.dtype, device=p0.device)
    buf = model._comm_buffer
    pending, used = [], 0

    def flush():
        nonlocal pending, used
        if pending:
            view = buf[:used]
            dist.all_reduce(view)
            view /= world
            offset = 0
            for g in pending:
                g.copy_(buf[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        pending, used = [], 0

    for p in model.parameters():
        g = p.grad
        if g.numel() > ELEMENTS:
            dist.all_reduce(g)
            g /= world
            continue
        if used + g.numel() > ELEMENTS:
            flush()
        buf[used:used + g.numel()].copy_(g.reshape(-1))
        pending.append(g)
        used += g.numel()
    flush()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
