# expect: too_much_memory
# 反例（半对）：照着“分桶”的思路把梯度攒成小桶逐个 AllReduce，却把每个用过的桶留在列表里，到 optimizer.step()
# 之后才一起释放。每个桶都不大，但它们同时活着，加起来又是一整份梯度，和扁平缓冲区一样多。
import torch
import torch.distributed as dist

BUCKET = 64 * 1024      # elements


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    grads = [p.grad for p in model.parameters()]
    used, bucket, size = [], [], 0
    for i, g in enumerate(grads):
        bucket.append(g)
        size += g.numel()
        if size >= BUCKET or i == len(grads) - 1:
            flat = torch.cat([x.reshape(-1) for x in bucket])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for x in bucket:
                x.copy_(flat[offset:offset + x.numel()].view_as(x))
                offset += x.numel()
            used.append(flat)
            bucket, size = [], 0
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    used.clear()
    return loss.item()
