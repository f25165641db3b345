import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """梯度一算好就通信：每个参数挂一个 post-accumulate-grad 钩子，在钩子里 AllReduce 这个梯度、
    用它自己的 AdamW 更新、然后释放梯度。AllReduce 是同步的，反向要等它做完才继续（不重叠，用时间换显存），
    整份梯度从不同时存在。"""
    if not hasattr(model, "_per_param_adamw"):          # 第一次调用时挂钩子，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        world = dist.get_world_size()
        per_param = {p: torch.optim.AdamW([p], **hyper) for p in model.parameters()}

        def reduce_step_free(p):
            dist.all_reduce(p.grad)                      # 同步：下一行要用规约后的梯度
            p.grad /= world
            per_param[p].step()
            p.grad = None                                # 用完就释放

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(reduce_step_free)
        model._per_param_adamw = per_param
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()                                      # 更新在反向过程中已经做完了
    return loss.item()
