"""第 9 章 张量并行的 MLP（ch09-tensor-parallel）.

Kind "call" (case tp_mlp) on 2 gloo processes: the grader starts both ranks and initialises
torch.distributed before the learner's code loads. Every rank gets the full fp32 weights in HOST
memory and the same x on its device, and must return the full output on its device. Judged on
every rank's output against the starter's and on the worst rank's peak. The simulated cuBLAS
workspaces (32 MiB each, the same for both codes) are off at ci scale: at this size they would hide
the weights and activations that tensor parallelism splits.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):
    """每个 rank 都把完整的权重搬上自己的设备，把整个 MLP 算一遍。
    结果是对的，但每个 rank 的峰值显存和单卡时一样。"""
    w1, b1 = device.to_device(fc_weight), device.to_device(fc_bias)
    w2, b2 = device.to_device(proj_weight), device.to_device(proj_bias)
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    return F.linear(h, w2, b2)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (d 512, x 4 x 128 x 512, 2 ranks; torch 2.13.0+cpu, 2026-12-02; "
               "`vramlab grade ch09-tensor-parallel <file>` on the reference and tests/alternatives/"
               "ch09-tensor-parallel/): starter 17.01 MiB worst-rank peak; the reference (contiguous shards) 0.53x, "
               "strided shards with the bias on rank 0 and torch.tensor_split shards 0.53x; slicing the shards on "
               "the device after uploading the full weights 0.76x. Hidden case (d 640, x 2 x 128 x 640): reference "
               "0.52x, the two alternatives 0.55x; a shard size hard-coded to 1024 hidden units is incorrect there. "
               "Target 0.65x (the reference is 18% inside it, the alternatives at least 15%).")

SPEC = ExerciseSpec(
    id="ch09-tensor-parallel",
    chapter=9,
    title="张量并行：每个 rank 只放一半的 MLP",
    task=(
        "评分器启动 **2 个进程**（gloo 后端），并在运行你的代码之前初始化好 `torch.distributed`："
        "`dist.get_rank()`、`dist.get_world_size()` 和各种集合通信都可以直接用。\n\n"
        "`tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device)` 计算 GPT-2 式 MLP："
        "`y = proj(gelu(fc(x), approximate=\"tanh\"))`。权重按 `nn.Linear` 的布局给出（`fc_weight` 是 "
        "`[4d, d]`，`proj_weight` 是 `[d, 4d]`），完整的 FP32 权重放在**主存**里，用 `device.to_device()` "
        "搬上设备；`x`（`[batch, seq, d]`）已经在每个 rank 的设备上（两个 rank 相同）。"
        "每个 rank 都要返回完整的 `y`，放在设备上。\n\n"
        "起始代码让每个 rank 把完整权重搬上设备、把整个 MLP 算一遍：两个 rank 做的是同一件事，"
        "每个 rank 的峰值都和单卡一样。请让两个 rank 分担这个 MLP，把**每个 rank** 的峰值显存中最大的那个"
        "降到目标以下，结果与起始代码一致。你看不到的配置里宽度、批大小和序列长度都可能不同。"
    ),
    function="tp_mlp",
    signature="def tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="tp_mlp", d_model=512, world_size=2, cublas_workspace=False),
             hidden=(Variation(catches="a shard size written as a number (1024 = 4 x 512 / 2) leaves hidden units "
                                       "out at another width; half the tokens, so it costs less",
                               batch=2, settings={"d_model": 640}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="tp_mlp", d_model=4096, world_size=2)),
    target_ratio=0.65,
    rtol=1e-4,
    points=10,
    kind="call",
    metric="peak_allocated",
    giveaways=(r"all_reduce", r"reduce_scatter", r"all_gather", r"proj_weight\[\s*:", r"列并行", r"行并行"),
    hints=(
        "两个 rank 都把整个 MLP 算了一遍：哪些张量在两个 rank 上一模一样、是重复的？"
        "最大的几块（权重、4d 宽的中间结果）能不能每个 rank 只放一部分？",
        "GELU 是逐元素的：把 4d 个隐藏单元分给各 rank，每个 rank 只需要 `fc` 里对应的行（和偏置）、"
        "`proj` 里对应的列，就能算出 y 的一个**部分和**；各 rank 的部分和加起来才是 y。"
        "切分要在主存里做，只把自己那份搬上设备。偏置 `proj_bias` 该加几次？",
        "rank r 取 `fc_weight[r*k:(r+1)*k]`、`fc_bias[r*k:(r+1)*k]` 和 `proj_weight[:, r*k:(r+1)*k]`"
        "（k = 4d / world），切好再 `device.to_device()`；部分和用 `dist.all_reduce(y)` 求和，"
        "之后再加一次 `proj_bias`（Megatron-LM 的列并行 + 行并行）。",
    ),
)
