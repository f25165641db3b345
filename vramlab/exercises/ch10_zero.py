"""第 10 章 ZeRO-1：切分优化器状态（ch10-zero）.

Kind "train_step" on 2 gloo processes (data parallel), judged like ch08: every rank's losses and
parameter update against the same rank of the trusted starter run, and the worst rank's steady
peak. The starter is plain data parallelism (every rank keeps the full AdamW state); sharding the
state across the 2 ranks saves a quarter of the model states (16 -> 12 bytes per parameter).
cuBLAS workspaces are off at ci scale, as in ch08.
"""
from .ch08_allreduce import averaged_train_step
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale

STARTER = averaged_train_step("""普通的数据并行（DDP 的做法）：梯度求平均后，每个 rank 都用完整的 AdamW 更新全部参数，
于是每个 rank 都存着一整份一阶矩和二阶矩。""")

SOLUTION = '''\
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def train_step(model, optimizer, batch, device):
    """ZeRO-1：每个 rank 只为自己负责的那一份参数保存 AdamW 状态、只更新那一份，
    然后把更新后的参数广播给其他 rank。第一次调用时创建，之后每步复用。"""
    zero = getattr(model, "_zero_optimizer", None)
    if zero is None:
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(optimizer), **hyper)
        model._zero_optimizer = zero
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    zero.step()
    zero.zero_grad(set_to_none=True)
    return loss.item()
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch10-zero",
    chapter=10,
    title="ZeRO-1：每个 rank 只存一半的优化器状态",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半，模型和一个普通的 `torch.optim.AdamW` 已经建好。\n\n"
        "`train_step(model, optimizer, batch, device)` 做一步数据并行训练并返回本 rank 的损失。"
        "起始代码是 DDP 的做法：梯度求平均后，每个 rank 都用完整的 AdamW 更新全部参数，"
        "每个 rank 都存着一整份优化器状态（每个参数 8 字节）。\n\n"
        "请实现 **ZeRO-1**：把优化器状态切分到 2 个 rank 上，每个 rank 只更新自己负责的参数，"
        "再把更新后的参数同步给其他 rank。可以用 `torch.distributed.optim.ZeroRedundancyOptimizer`"
        "（第一次调用时创建，存起来下一步复用），也可以自己写。每个 rank 的损失和参数更新都要与起始代码一致。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1, settings=train_step.Settings(world_size=2)),
    target_ratio=0.9,
    points=10,
    hints=(
        "`ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(optimizer), lr=..., betas=..., eps=..., "
        "weight_decay=...)`（超参数取自 `optimizer.defaults`），"
        "第一次调用时创建，存在 `model` 的一个属性上，以后每步复用（每步新建会丢掉 AdamW 的状态）。",
        "梯度仍然要先在 rank 之间求平均；ZeRO-1 切的只是优化器状态和参数更新。",
        "自己写时：rank r 只对自己那一半参数调用一个只含这些参数的 AdamW，然后对每个参数 "
        "`dist.broadcast(p.data, src=拥有它的 rank)`。",
    ),
)
