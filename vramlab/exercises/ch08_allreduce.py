"""第 8 章 梯度原地 AllReduce（ch08-allreduce）.

Kind "train_step" on 2 gloo processes (data parallel): the grader starts both ranks, initialises
torch.distributed, gives each rank its half of every global batch and judges every rank's losses
and parameter update against the same rank of the trusted starter run, and the worst rank's
steady peak. The simulated cuBLAS workspaces are off at ci scale (a fixed 64 MiB for both codes
would hide the one gradient-sized buffer this exercise is about).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """数据并行的一步：本 rank 的半个 batch 前向、反向，再在所有 rank 之间平均梯度。
    起始代码把全部梯度拼成一块扁平缓冲区再 AllReduce：通信只有一次，
    但每个 rank 都多占了一整份梯度大小的显存，而且它一直活到函数返回。"""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''

def averaged_train_step(doc: str) -> str:
    """Data parallel with the gradients averaged in place, one parameter at a time: the solution
    here and the starter of ch10-zero (which then shards the optimizer state)."""
    lines = "\n    ".join(doc.strip().splitlines())
    return f'''import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """{lines}"""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''


SOLUTION = averaged_train_step("""逐个参数原地 AllReduce：梯度张量本身就是通信缓冲区，不需要任何额外的拷贝。
（真实框架会把小参数攒成几 MiB 的桶来减少通信次数，桶的大小就是额外显存的上限。）""")

TARGET_NOTE = ("Measured on the sim at ci scale (tiny, global batch 4 x 64, 2 ranks): starter 13.59 MiB, "
               "solution 11.93 MiB (0.88x). The flat copy is 4 bytes per parameter against AdamW's 16 bytes of "
               "model states plus its foreach temporaries, so the saving is modest by nature. Target 0.93x.")

SPEC = ExerciseSpec(
    id="ch08-allreduce",
    chapter=8,
    title="梯度 AllReduce：不要为通信再拷一份梯度",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半。\n\n"
        "`train_step(model, optimizer, batch, device)` 在本 rank 的数据上前向、反向，"
        "把梯度在所有 rank 之间**求平均**（AllReduce 求和再除以 rank 数），然后 `optimizer.step()`、"
        "`zero_grad`，返回本 rank 的损失（Python `float`）。\n\n"
        "起始代码用 `torch.cat` 把所有梯度拼成一块扁平缓冲区，只做一次 AllReduce，再拷回各个梯度："
        "每个 rank 都多占一整份梯度大小的显存。请改成**原地** AllReduce：逐个参数，"
        "或者攒成不超过几 MiB 的桶（也可以在反向过程中用钩子边算边通信）。"
        "每个 rank 的损失和参数更新都要与起始代码一致；评分看的是各 rank 稳态峰值中最大的那个。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1, settings=train_step.Settings(world_size=2)),
    target_ratio=0.93,
    points=10,
    hints=(
        "`for p in model.parameters(): dist.all_reduce(p.grad); p.grad /= dist.get_world_size()`。",
        "分桶时，桶的大小就是额外显存的上限：攒满一个桶就通信、就释放，别把所有梯度攒进一块。",
        "别忘了除以 rank 数：AllReduce 默认求和，起始代码求的是平均。",
    ),
)
