"""第 16 章 GQA 注意力不复制 K/V（ch16-gqa）.

Kind "call" (case gqa_attention): q [batch, heads, seq, head_dim] and k, v [batch, kv_heads, seq,
head_dim] (fp32, requiring grad) on the device; the harness backpropagates a fixed gradient and
compares the output and the three gradients with the starter's. cuBLAS workspaces are off at ci
scale (the fused kernel uses none; see ch14). The gpu scale runs in bf16: on CUDA, SDPA serves GQA
(`enable_gqa=True`) only from the flash kernel, which needs fp16/bf16 (fp32 would fall back to the
math kernel, which copies K/V and keeps the S x S matrix); hence rtol 1e-2 (bf16 rounding).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch
import torch.nn.functional as F


def attention(q, k, v):
    """GQA 的常见写法：先把 k、v 按组复制成和 q 一样多的头，再调用 SDPA。
    复制出来的 k、v 是新的张量，要一直保存到反向。"""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
'''

SOLUTION = '''\
import torch
import torch.nn.functional as F


def attention(q, k, v):
    """enable_gqa=True：内核直接按组读取共享的 k、v 头，不复制。"""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch16-gqa",
    chapter=16,
    title="GQA：不要把共享的 K/V 头复制出来",
    task=(
        "`attention(q, k, v)` 计算分组查询注意力（GQA，因果）：`q` 是 `[batch, heads, seq, head_dim]`，"
        "`k`、`v` 是 `[batch, kv_heads, seq, head_dim]`，`heads` 是 `kv_heads` 的整数倍，每组查询头共享一个 K/V 头。"
        "它们都在设备上、需要梯度（模拟设备上是 FP32，真卡规模是 BF16）；评分器对输出做反向传播，比较输出和 q、k、v 的梯度。\n\n"
        "起始代码先用 `repeat_interleave` 把 `k`、`v` 复制成 `heads` 个头再调用 SDPA：复制出来的张量和 q 一样大，"
        "而且要保存到反向。请不复制地算出同样的结果，例如 "
        "`F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`（PyTorch 2.5 起）。"
    ),
    function="attention",
    signature="def attention(q, k, v):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=512, steps=1, warmup=0,
             settings=call.Settings(case="gqa_attention", heads=8, kv_heads=2, head_dim=64, cublas_workspace=False)),
    gpu=Scale(model="llama-1b", batch=4, seq=4096, steps=1, warmup=0,
              settings=call.Settings(case="gqa_attention", heads=32, kv_heads=8, head_dim=64, dtype="bfloat16")),
    target_ratio=0.75,
    rtol=1e-2,
    points=10,
    kind="call",
    hints=(
        "`F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`。",
        "`expand` 得到的视图不占新显存，但把它 `reshape` 成 heads 个头时就复制了；`enable_gqa` 才是不复制的写法。",
        "在真卡上用 `enable_gqa` 要 FP16/BF16：CUDA 只有 flash 内核支持 GQA，FP32 会退回数学实现。",
    ),
)
