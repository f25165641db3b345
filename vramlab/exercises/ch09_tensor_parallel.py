"""第 9 章 张量并行的 MLP（ch09-tensor-parallel）.

Kind "call" (case tp_mlp) on 2 gloo processes: the grader starts both ranks and initialises
torch.distributed before the learner's code loads. Every rank gets the full fp32 weights in HOST
memory and the same x on its device, and must return the full output on its device. Judged on
every rank's output against the starter's and on the worst rank's peak. The simulated cuBLAS
workspaces (32 MiB each, the same for both codes) are off at ci scale: at this size they would hide
the weights and activations that tensor parallelism splits.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    """每个 rank 都把完整的权重搬上自己的设备，把整个 MLP 算一遍：没有切分，
    两个 rank 各占一整份权重和一整份 4d 宽的中间激活值。"""
    w1, b1 = device.to_device(fc_weight), device.to_device(fc_bias)
    w2, b2 = device.to_device(proj_weight), device.to_device(proj_bias)
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    return F.linear(h, w2, b2)
'''

SOLUTION = '''\
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    """Megatron 式张量并行：fc 按输出维切（列并行），proj 按输入维切（行并行）。
    每个 rank 只搬自己的那一份权重，算出部分和，一次 all_reduce 得到完整输出。"""
    rank, world = dist.get_rank(), dist.get_world_size()
    part = fc_weight.shape[0] // world
    rows = slice(rank * part, (rank + 1) * part)
    w1, b1 = device.to_device(fc_weight[rows]), device.to_device(fc_bias[rows])
    w2 = device.to_device(proj_weight[:, rows])
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")      # GELU 逐元素：切开后各算各的
    y = F.linear(h, w2)                                        # 部分和
    dist.all_reduce(y)                                         # 求和，得到完整输出
    return y + device.to_device(proj_bias)                     # 偏置只加一次
'''

TARGET_NOTE = ("Measured on the sim at ci scale (d 512, x 4 x 128 x 512, 2 ranks): see "
               "`vramlab grade-bench --starters`. Target 0.65x of the starter's worst-rank peak.")

SPEC = ExerciseSpec(
    id="ch09-tensor-parallel",
    chapter=9,
    title="张量并行：每个 rank 只放一半的 MLP",
    task=(
        "评分器启动 **2 个进程**（gloo 后端），并在运行你的代码之前初始化好 `torch.distributed`："
        "`dist.get_rank()`、`dist.get_world_size()`、`dist.all_reduce(t)` 都可以直接用。\n\n"
        "`tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device)` 计算 GPT-2 式 MLP："
        "`y = proj(gelu(fc(x), approximate=\"tanh\"))`。权重按 `nn.Linear` 的布局给出（`fc_weight` 是 "
        "`[4d, d]`，`proj_weight` 是 `[d, 4d]`），完整的 FP32 权重放在**主存**里；`x`（`[batch, seq, d]`）"
        "已经在每个 rank 的设备上（两个 rank 相同）。每个 rank 都要返回完整的 `y`，放在设备上。\n\n"
        "起始代码让每个 rank 把完整权重搬上设备、把整个 MLP 算一遍。请按 Megatron-LM 的做法切分："
        "`fc` 按输出维切（列并行），`proj` 按输入维切（行并行），每个 rank 只用 `device.to_device()` "
        "搬自己的那一份，算出部分和后 `all_reduce`，`proj_bias` 只加一次。"
        "评分比较的是**每个 rank** 的峰值显存中最大的那个。"
    ),
    function="tp_mlp",
    signature="def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="tp_mlp", d_model=512, world_size=2, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="tp_mlp", d_model=4096, world_size=2)),
    target_ratio=0.65,
    rtol=1e-4,
    points=10,
    kind="call",
    metric="peak_allocated",
    hints=(
        "rank r 的 fc 行：`fc_weight[r*k:(r+1)*k]`（k = 4d / world），proj 的列：`proj_weight[:, r*k:(r+1)*k]`。",
        "GELU 是逐元素的，所以列并行之后各 rank 可以各自做；`all_reduce` 求的是 proj 的部分和。",
        "偏置 `proj_bias` 要在 all_reduce 之后加（或者只在一个 rank 上加），否则会加 world 次。",
    ),
)
