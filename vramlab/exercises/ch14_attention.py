"""第 14 章 注意力不存 S×S 矩阵（ch14-attention）.

Kind "call" (case attention): q, k, v ([batch, heads, seq, head_dim], fp32, requires_grad) are
on the device; the harness calls `attention(q, k, v, softcap)`, backpropagates a fixed random
gradient through the output, and compares the output and the three gradients with the starter's.
The scores are soft-capped before the causal softmax (Gemma 2: `softcap * tanh(scores / softcap)`),
which no fused SDPA kernel computes: `F.scaled_dot_product_attention` alone gives a wrong result
(relative error 0.1-0.8 here), so the learner has to write the memory-saving attention: query
blocks, each recomputed in backward. The simulated cuBLAS workspaces are off at ci scale: any
matmul solution would pay two (64 MiB), more than the attention itself at this size.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import math

import torch


def attention(q, k, v, softcap):
    """带分数软上限（soft-capping）的因果自注意力，逐算子写法。
    tanh 的输出和 softmax 的概率都是 [batch, heads, seq, seq]，都被保存到反向，
    显存随序列长度的平方增长。"""
    seq = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = softcap * torch.tanh(scores / softcap)          # 把分数压到 (-softcap, softcap) 之间
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ v
'''

TARGET_NOTE = ("Measured on the sim at ci scale (batch 1, 4 heads, seq 1024, head_dim 32, softcap 5; cuBLAS "
               "workspaces off), torch 2.13.0+cpu, 2026-12-02, `vramlab grade ch14-attention FILE` / grade_source: "
               "starter 68.00 MiB. Reference (128-query blocks, non-reentrant checkpoints) 0.170x, hidden 0.176x and "
               "0.191x; 64-query blocks with reentrant checkpoints 0.122x (0.107, 0.118); a hand-written autograd.Function "
               "recomputing 64-query blocks 0.141x (0.115, 0.135). Refused: 128-query blocks without checkpoints 0.391x, "
               "one checkpoint per (batch, head) 0.324x (too_much_memory); SDPA alone 0.059x but relative error 1.78 "
               "(incorrect: it has no soft-capping). Target 0.25x. Out-of-process check: the reference's RSS beyond "
               "its reported peak read 8.5-11.1 MiB above the starter's on a quiet machine, but 24.7-24.8 MiB in a "
               "clean-clone CI run (query-block temporaries kept by the C allocator), over the 24 MiB allowance; "
               "settings.observer_slack_mib=24 adds that much. Hiding the starter's S x S tensors to reach the "
               "target still needs more than 48 MiB hidden at the visible scale.")

SPEC = ExerciseSpec(
    id="ch14-attention",
    chapter=14,
    title="注意力：不要把 S×S 的分数矩阵存下来",
    task=(
        "`attention(q, k, v, softcap)` 计算带**分数软上限**（logit soft-capping，Gemma 2 的做法）的因果自注意力："
        "`q`、`k`、`v` 的形状都是 `[batch, heads, seq, head_dim]`，FP32，已经在设备上并且需要梯度；`softcap` "
        "是一个正数。每个头的分数先乘 $1/\\sqrt{\\text{head\\_dim}}$，再变成 `softcap * tanh(分数 / softcap)`，然后加因果掩码、"
        "做 softmax、乘 `v`。评分器对你返回的输出做反向传播，比较输出和 q、k、v 的梯度。\n\n"
        "起始代码逐算子计算，为反向保存了 `[batch, heads, seq, seq]` 大小的 tanh 输出和 softmax 概率，"
        "显存随序列长度的平方增长。请改写它：输出和梯度不变，而前向和反向的任何时刻都不出现整张 "
        "`seq × seq` 的矩阵，即使只有一个头、序列很长，峰值也远低于起始代码。"
        "隐藏配置会换批大小、序列长度、头数、每头维度和 `softcap`。"
    ),
    function="attention",
    signature="def attention(q, k, v, softcap):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=1, seq=1024, steps=1, warmup=0,
             settings=call.Settings(case="attention", heads=4, head_dim=32, softcap=5.0, cublas_workspace=False,
                                   observer_slack_mib=24),
             hidden=(
                 Variation(catches="softcap or 1/sqrt(32) hard-coded; a view into blocks that assumes seq % block == 0; "
                                   "one checkpoint per (batch, head) instead of per query block (2 heads here)",
                           batch=2, seq=900, settings={"heads": 1, "head_dim": 16, "softcap": 3.0}),
                 Variation(catches="softcap hard-coded; per-(batch, head) checkpoints: one head holds the whole S x S",
                           batch=1, seq=768, settings={"heads": 2, "head_dim": 16, "softcap": 8.0}),
             )),
    gpu=Scale(model="gpt2-small", batch=8, seq=2048, steps=1, warmup=0,
              settings=call.Settings(case="attention", heads=12, head_dim=64, softcap=5.0)),
    target_ratio=0.25,
    rtol=1e-4,
    points=10,
    kind="call",
    metric="peak_allocated",
    hints=(
        "起始代码的峰值出现在哪里？那时有几个 `seq × seq` 的张量还活着，是谁为反向留着它们？",
        "PyTorch 的融合注意力内核能不能在 softmax 之前对分数做 tanh？如果不能：每一行查询的输出只依赖哪些分数？"
        "能不能一次只处理一部分查询行，让 `seq × seq` 变成“几行 × seq”？",
        "只把查询分块还不够：每一块为反向保存的 tanh 输出和概率加起来，仍是整张矩阵的一半左右。"
        "要让每一块在前向结束后不留下任何大矩阵，到反向用到时再把它算出来。",
        "把一块的计算写成函数，用 `torch.utils.checkpoint.checkpoint(块函数, q 的这几行, k 和 v 到块末尾的前缀, "
        "起始位置, softcap, use_reentrant=False)` 调用，最后沿序列维 `torch.cat`；因果掩码按**绝对位置**算。",
    ),
    giveaways=(r"checkpoint", r"检查点", r"重算|重新计算", r"autograd\.Function"),
)
