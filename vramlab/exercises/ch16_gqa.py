"""第 16 章 GQA 注意力不复制 K/V（ch16-gqa）.

Kind "call" (case gqa_attention): q [batch, heads, seq, head_dim] and k, v [batch, kv_heads, seq,
head_dim] (bf16, requiring grad) on the device; the harness backpropagates a fixed gradient and
compares the output and the three gradients with the starter's. Both scales run in bf16: on CUDA
(torch 2.13), SDPA serves GQA (`enable_gqa=True`) only from the flash kernel, which needs fp16/bf16;
fp32 falls back to the math kernel, which copies K/V and keeps the S x S matrix. The simulated device
accounts fp32 GQA as the memory-efficient kernel (vramlab/sim/kernels.py), so an fp32 ci case would
pass what a real card punishes; in bf16 both agree, and upcasting to fp32 inside fails here too.
rtol 3e-2: the starter sums dK/dV over the group in bf16 (repeat_interleave's backward), the fused
kernel accumulates in fp32; correct solutions differ from it by up to 0.9e-2 (norm-relative).
cuBLAS workspaces are off at ci scale (the fused kernel uses none; see ch14).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch
import torch.nn.functional as F


def attention(q, k, v):
    """GQA 的常见写法：先把 k、v 按组复制成和 q 一样多的头，再调用 SDPA。
    复制出来的 k、v 和 q 一样大，要一直保存到反向；反向时它们的梯度也先按 q 的头数算出来。"""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (batch 4, 8 heads, 2 K/V heads, seq 256, head_dim 64, bf16; cuBLAS "
               "workspaces off), torch 2.13.0+cpu, 2026-12-02, `vramlab grade ch16-gqa FILE` / grade_source: starter "
               "10.56 MiB. Reference (enable_gqa) 0.479x, hidden (MQA 8:1; 12:4) 0.442x and 0.503x; folding each group's "
               "query heads into rows with an explicit causal mask 0.598x (0.539, 0.619). Refused (too_much_memory): "
               "expand + reshape 1.00x, one SDPA per group over expanded K/V 0.760x, upcast to fp32 + enable_gqa 1.284x. "
               "Target 0.70x. In fp32 the sim would take the upcast as free (1.0x of the reference): hence bf16.")

SPEC = ExerciseSpec(
    id="ch16-gqa",
    chapter=16,
    title="GQA：不要把共享的 K/V 头复制出来",
    task=(
        "`attention(q, k, v)` 计算分组查询注意力（GQA，因果）：`q` 是 `[batch, heads, seq, head_dim]`，"
        "`k`、`v` 是 `[batch, kv_heads, seq, head_dim]`，`heads` 是 `kv_heads` 的整数倍，"
        "相邻的 `heads // kv_heads` 个查询头共享一个 K/V 头（查询头 i 用 K/V 头 `i // (heads // kv_heads)`）。"
        "它们都是 BF16，在设备上、需要梯度；评分器对输出做反向传播，比较输出和 q、k、v 的梯度。\n\n"
        "起始代码先把 `k`、`v` 复制成 `heads` 个头再调用 SDPA：复制出来的张量和 q 一样大，而且要保存到反向。"
        "请改写它：结果不变，但共享的 K/V 头不再复制成 `heads` 份，峰值显存降到目标以下。"
        "在真卡上，输入保持 BF16 时才有省显存的内核可用（原因见本章正文），所以不要换成 FP32 计算。"
        "隐藏配置会换批大小、头数和 K/V 头数（包括只有一个 K/V 头的 MQA）。"
    ),
    function="attention",
    signature="def attention(q, k, v):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=256, steps=1, warmup=0,
             settings=call.Settings(case="gqa_attention", heads=8, kv_heads=2, head_dim=64, dtype="bfloat16",
                                    cublas_workspace=False),
             hidden=(
                 Variation(catches="4 query heads per K/V head hard-coded (a fold of q into kv_heads x 4 rows, "
                                   "a mask repeated 4 times); per-group SDPA over expanded K/V: with one K/V head "
                                   "the expanded dK/dV is the starter's",
                           batch=2, settings={"heads": 8, "kv_heads": 1}),
                 Variation(catches="2 K/V heads or 4 groups hard-coded (here 4 K/V heads, 3 groups)",
                           batch=2, settings={"heads": 12, "kv_heads": 4}),
             )),
    gpu=Scale(model="llama-1b", batch=4, seq=4096, steps=1, warmup=0,
              settings=call.Settings(case="gqa_attention", heads=32, kv_heads=8, head_dim=64, dtype="bfloat16")),
    target_ratio=0.7,
    rtol=3e-2,
    points=10,
    kind="call",
    hints=(
        "峰值时，除了 q、k、v 本身，还有哪些和 q 一样大的张量活着？为什么反向需要它们？",
        "注意力内核本身能不能直接处理“K/V 头比查询头少”的输入？看看 `F.scaled_dot_product_attention` 的文档里"
        "和分组查询有关的参数；`expand` 出的视图再 `reshape` 成 `heads` 个头时，还是会复制。",
        "`F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`（PyTorch 2.5 起）；"
        "在 CUDA 上它只由 flash 内核支持，所以输入要保持 BF16/FP16。",
    ),
    giveaways=(r"enable_gqa",),
)
