# expect: exception
# 只对看到的配置成立：预先分配一块固定大小的通信缓冲区，大小是看到的模型里最大的那个梯度（词嵌入，
# 1024 × 128 个元素），每个梯度拷进去、AllReduce、再拷回来。在看到的配置上额外显存只有这一块，能通过；
# 隐藏配置换了模型的宽度或词表，最大的梯度装不进这块缓冲区。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    p0 = next(model.parameters())
    buf = getattr(model, "_comm_buffer", None)
    if buf is None:
        buf = model._comm_buffer = p0.grad.new_empty(1024 * 128)
    world = dist.get_world_size()
    for p in model.parameters():
        n = p.grad.numel()
        view = buf[:n]
        view.copy_(p.grad.reshape(-1))
        dist.all_reduce(view)
        view /= world
        p.grad.copy_(view.view_as(p.grad))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
