"""第 29 章 ZeRO-2：梯度也只留自己那一份（ch29-zero2）.

Kind "train_step" on 2 gloo processes, judged like ch08/ch10 (every rank against the same rank of the
trusted starter; the worst rank's steady peak). The starter is ch10's solution, ZeRO-1 with
ZeroRedundancyOptimizer: half of AdamW's states per rank, but the full gradients on every rank. The
fix is what DeepSpeed's `"zero_optimization": {"stage": 2}` does. The floor counts the parameters plus
half the gradients and half the states (2.5 copies of the parameters on the worst rank). cuBLAS
workspaces are off at ci scale.
"""
from .ch10_zero import SOLUTION as ZERO1
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale

STARTER = ZERO1.replace('''    """ZeRO-1：每个 rank 只为自己负责的那一份参数保存 AdamW 状态、只更新那一份，
    然后把更新后的参数广播给其他 rank。第一次调用时创建，之后每步复用。"""''', '''    """ZeRO-1（DeepSpeed 的 stage 1）：优化器状态按 rank 切分，每个 rank 只存一半。
    但反向结束时，每个 rank 仍然握着全部参数的完整梯度，直到 step 之后才释放。"""''')

SOLUTION = '''\
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """ZeRO-2（DeepSpeed 的 stage 2）：每个参数归一个 rank 所有。梯度一算好就归约到它的所有者，
    其他 rank 立刻释放这份梯度；所有者用自己的 AdamW 更新，再把新参数广播出去。"""
    state = getattr(model, "_zero2", None)
    if state is None:                                    # 第一次调用：分片、建优化器、挂钩子
        world, rank = dist.get_world_size(), dist.get_rank()
        params = list(model.parameters())
        owner, load = {}, [0] * world
        for p in sorted(params, key=lambda q: -q.numel()):   # 按大小贪心分片，各 rank 负担接近
            owner[p] = load.index(min(load))
            load[owner[p]] += p.numel()
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        mine = [p for p in params if owner[p] == rank]
        local = torch.optim.AdamW(mine, **hyper)

        def reduce_to_owner(p):
            dist.reduce(p.grad, dst=owner[p])            # 求和只送到所有者那里
            if owner[p] == rank:
                p.grad /= world
            else:
                p.grad = None                            # 不归我管的梯度：立刻释放

        for p in params:
            p.register_post_accumulate_grad_hook(reduce_to_owner)
        state = model._zero2 = (params, owner, local)
    params, owner, local = state
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    local.step()
    local.zero_grad(set_to_none=True)
    for p in params:                                     # 所有者把更新后的参数发给其他 rank
        dist.broadcast(p.data, src=owner[p])
    return loss.item()
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch29-zero2",
    chapter=29,
    title="ZeRO-2：梯度也按 rank 切分",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半。`train_step(model, optimizer, batch, device)` 做一步数据并行训练"
        "（梯度在所有 rank 之间求平均，AdamW 更新），返回本 rank 的损失（Python `float`）。\n\n"
        "起始代码是第 10 章的 ZeRO-1（`ZeroRedundancyOptimizer`，DeepSpeed 的 stage 1）：优化器状态每个 rank 只存一半，"
        "但反向结束时每个 rank 仍然握着**全部**梯度。请实现 **ZeRO-2**（DeepSpeed 的 stage 2）："
        "每个参数归一个 rank 所有；在 `register_post_accumulate_grad_hook` 里把梯度归约（`dist.reduce`）到所有者，"
        "不归自己管的梯度立刻释放；反向结束后所有者用自己的 AdamW 更新，再用 `dist.broadcast` 把新参数发给其他 rank。"
        "每个 rank 的损失和参数更新都要与起始代码一致；评分看各 rank 稳态峰值中最大的那个。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False, floor_copies=2.5,
                                          config={"n_layer": 6, "n_embd": 256, "n_head": 4, "vocab_size": 1024})),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=train_step.Settings(world_size=2, floor_copies=2.5)),
    target_ratio=0.92,
    points=10,
    hints=(
        "分片、优化器和钩子只建一次：存在模型的一个属性上（比如 `model._zero2`）。",
        "按参数大小贪心分给负担最轻的 rank，两边的梯度和状态才差不多大：评分看的是最差的那个 rank。",
        "钩子里：`dist.reduce(p.grad, dst=所有者)`；是所有者就除以 rank 数，不是就 `p.grad = None`。",
        "step 之后对每个参数 `dist.broadcast(p.data, src=所有者)`，所有 rank 的参数才一致。",
    ),
)
