"""第 20 章 通信与计算重叠：梯度一算好就 AllReduce、就更新、就释放（ch20-overlap）.

Kind "train_step" on 2 gloo processes (data parallel), the contract of ch08: every rank's losses and
parameter update are judged against the same rank of the trusted starter, and the worst rank's
steady peak. The starter is ch08's solution (in-place AllReduce after backward, then one
optimizer.step): every gradient is alive at the end of backward, and AdamW's foreach temporaries
come on top. cuBLAS workspaces are off at ci scale (a fixed 64 MiB would hide the difference).
"""
from .ch08_allreduce import averaged_train_step
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale

STARTER = averaged_train_step("""数据并行的一步：反向全部结束以后，才逐个参数原地 AllReduce，再统一 optimizer.step()。
反向结束时全部梯度同时活着；通信也只能等反向算完才开始，没有和计算重叠。""")

SOLUTION = '''\
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """梯度一算好就通信：每个参数挂一个 post-accumulate-grad 钩子，在钩子里 AllReduce 这个梯度、
    用它自己的 AdamW 更新、然后释放梯度。通信和剩下的反向重叠，整份梯度从不同时存在。"""
    if not hasattr(model, "_per_param_adamw"):          # 第一次调用时挂钩子，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        world = dist.get_world_size()
        per_param = {p: torch.optim.AdamW([p], **hyper) for p in model.parameters()}

        def reduce_step_free(p):
            dist.all_reduce(p.grad)                      # 真实训练里用 async_op=True 让通信在后台跑
            p.grad /= world
            per_param[p].step()
            p.grad = None                                # 用完就释放

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(reduce_step_free)
        model._per_param_adamw = per_param
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()                                      # 更新在反向过程中已经做完了
    return loss.item()
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch20-overlap",
    chapter=20,
    title="通信与计算重叠：梯度算好就 AllReduce、就更新、就释放",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半。\n\n"
        "`train_step(model, optimizer, batch, device)` 做一步数据并行训练（梯度在所有 rank 之间求平均，"
        "AdamW 更新），返回本 rank 的损失（Python `float`）。\n\n"
        "起始代码等反向**全部结束**才逐个参数 AllReduce，再统一 `optimizer.step()`：反向结束时整份梯度同时活着，"
        "通信也没法和计算重叠。请在每个参数上挂 `register_post_accumulate_grad_hook`：梯度一算好就在钩子里 "
        "AllReduce、除以 rank 数、用**这个参数自己的** AdamW（超参数取 `optimizer.defaults`，第一次调用时创建，之后复用）"
        "更新，再把梯度设为 `None` 释放。每个 rank 的损失和参数更新都要与起始代码一致；评分看各 rank 稳态峰值中最大的那个。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False, floor_copies=3,
                                          config={"n_layer": 6, "n_embd": 256, "n_head": 4, "vocab_size": 1024})),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=train_step.Settings(world_size=2, floor_copies=3)),
    target_ratio=0.85,
    points=10,
    hints=(
        "钩子只挂一次：存在模型的一个属性上（比如 `model._per_param_adamw`），下次调用先检查它在不在。",
        "钩子的参数是参数本身 `p`：`dist.all_reduce(p.grad)`，`p.grad /= 世界大小`，`opt[p].step()`，`p.grad = None`。",
        "每个参数一个 `torch.optim.AdamW([p], lr=..., betas=..., eps=..., weight_decay=...)`，超参数与 `optimizer.defaults` 相同。",
    ),
)
