# expect: too_much_memory
# 手写 ZeRO-1，按参数序号轮流切分：第 i 个参数归 rank i % world。其余与连续切分相同：梯度求平均，每个 rank
# 用只含自己参数的 AdamW 更新，再把每个参数从它的主人广播给其他 rank。结果正确，但这是个"差一点"的反例：
# GPT-2 的参数是 weight、bias 交替排列的，按序号轮流分，rank 0 拿到全部矩阵（tiny 模型 88% 的元素），
# 它的优化器状态几乎没少，而评分看的是最差那个 rank 的峰值（实测 0.96 倍，目标 0.90）。
# 轮流切分要先按大小排序（见 shard_round_robin_by_size.py）。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    world, rank = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    shard_opt = getattr(model, "_zero_shard", None)
    if shard_opt is None:
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        shard_opt = model._zero_shard = torch.optim.AdamW(
            [p for i, p in enumerate(params) if i % world == rank], foreach=True, **hyper)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= world
    shard_opt.step()
    for i, p in enumerate(params):
        dist.broadcast(p.data, src=i % world)
    for p in params:
        p.grad = None
    return loss.item()
