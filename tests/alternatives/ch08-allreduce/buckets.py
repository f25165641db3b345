# expect: pass
# 分桶：按参数顺序把梯度攒成不超过 64 Ki 个元素（256 KiB）的桶，拼成一块做一次 AllReduce，再拷回各个梯度，
# 桶用完就释放；比桶还大的梯度直接原地 AllReduce。额外显存只有一个小桶，和模型大小无关。
import torch
import torch.distributed as dist

BUCKET = 64 * 1024      # elements


def _flush(bucket, world):
    if not bucket:
        return
    flat = torch.cat([g.reshape(-1) for g in bucket])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in bucket:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def train_step(model, optimizer, batch, device):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    bucket, size = [], 0
    for p in model.parameters():
        g = p.grad
        if g.numel() >= BUCKET:
            dist.all_reduce(g)
            g /= world
            continue
        if size + g.numel() > BUCKET:
            _flush(bucket, world)
            bucket, size = [], 0
        bucket.append(g)
        size += g.numel()
    _flush(bucket, world)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
