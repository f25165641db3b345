# expect: too_much_memory
# 反例（只做了一半）：梯度一算好就在钩子里 AllReduce（通信确实和反向重叠了），但更新仍等反向结束后
# 由原来的优化器统一做。反向结束时整份梯度照样同时活着，优化器更新的临时张量也还在，显存没有省下来。
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    if not hasattr(model, "_reduce_hooks"):
        world = dist.get_world_size()

        def reduce(p):
            dist.all_reduce(p.grad)
            p.grad /= world

        model._reduce_hooks = [p.register_post_accumulate_grad_hook(reduce) for p in model.parameters()]
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
