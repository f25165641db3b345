"""第 14 章 注意力不存 S×S 矩阵（ch14-attention）.

Kind "call" (case attention): q, k, v ([batch, heads, seq, head_dim], fp32, requires_grad) are
on the device; the harness calls `attention(q, k, v)`, backpropagates a fixed random gradient
through the output, and compares the output and the three gradients with the starter's. The
simulated cuBLAS workspaces are off at ci scale: the starter's matmuls would create two (64 MiB),
the fused kernel none, and at this size that difference alone would decide the ratio and fail a
correct chunked solution (which still multiplies matrices).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import math

import torch


def attention(q, k, v):
    """因果自注意力，逐算子（eager）写法：scores、掩码后的 scores、softmax 概率都是
    [batch, heads, seq, seq]，其中一部分要保存到反向，显存随序列长度平方增长。"""
    seq = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ v
'''

SOLUTION = '''\
import torch
import torch.nn.functional as F


def attention(q, k, v):
    """融合的注意力内核（Flash / memory-efficient）：分块计算、在线 softmax，
    只为反向保存输出和每行的 logsumexp，不存 S×S 矩阵。"""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (batch 2, 4 heads, seq 512, head_dim 32): see "
               "`vramlab grade-bench --starters`. Target 0.50x.")

SPEC = ExerciseSpec(
    id="ch14-attention",
    chapter=14,
    title="注意力：不要把 S×S 的分数矩阵存下来",
    task=(
        "`attention(q, k, v)` 计算因果自注意力：`q`、`k`、`v` 的形状都是 `[batch, heads, seq, head_dim]`，"
        "FP32，已经在设备上，并且需要梯度。评分器会对你返回的输出做反向传播，比较输出和 q、k、v 的梯度。\n\n"
        "起始代码按公式逐步计算：分数矩阵、因果掩码、softmax、乘 `v`。`[batch, heads, seq, seq]` 的中间结果"
        "被保存到反向，显存随序列长度的平方增长。\n\n"
        "请改写它，得到同样的输出和梯度，但不保存 S×S 的矩阵：用 "
        "`torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)`（模拟设备按 CUDA 的 "
        "Flash / memory-efficient 内核记账），或者按 query 分块、配合激活检查点自己实现。"
    ),
    function="attention",
    signature="def attention(q, k, v):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=512, steps=1, warmup=0,
             settings=call.Settings(case="attention", heads=4, head_dim=32, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=2048, steps=1, warmup=0,
              settings=call.Settings(case="attention", heads=12, head_dim=64)),
    target_ratio=0.5,
    rtol=1e-4,
    points=10,
    kind="call",
    metric="peak_allocated",
    hints=(
        "`F.scaled_dot_product_attention(q, k, v, is_causal=True)` 一行就够；不要再传 attn_mask。",
        "自己分块时，每块 query 要看到它之前的全部 key；用 `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` "
        "包住每一块，反向时再重算这一块的分数。",
    ),
)
