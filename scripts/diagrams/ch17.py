"""Chapter 17: MoE routes each token to its top-k experts; memory follows total, compute follows active.

Left: a routing sketch (6 tokens, E = 8 experts, top-2). Right: Mixtral-8x7B model states at
16 bytes per parameter (mixed precision + Adam), split into expert weights and the rest, for
plain data parallelism, for expert parallelism over 8 cards, and "active parameters x 16"
(which is a compute figure, not memory). Parameter counts come from the official config shape.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

# Mixtral-8x7B (the chapter: official config shape, counted on the meta device)
TOTAL = 46_702_792_704
H, F_DIM, LAYERS, E, K = 4096, 14336, 32, 8, 2
EXPERTS = LAYERS * E * 3 * H * F_DIM          # three SwiGLU matrices per expert
REST = TOTAL - EXPERTS                         # attention, embeddings, routers, norms
N_EP = 8
BYTES = 16                                     # mixed precision + Adam (ZeRO paper)

ROUTES = [(0, 3), (1, 3), (0, 5), (2, 6), (5, 7), (3, 4)]   # illustrative top-2 choices


def draw() -> list[Figure]:
    f = Figure("ch17-moe-routing", "MoE 把每个 token 只送给 top-2 专家；Mixtral-8x7B 的模型状态按总参数计，不按激活参数计",
               "左：6 个 token 经路由器各选 8 个专家中的 2 个（示意）。右：按每参数 16 字节算的 Mixtral-8x7B 模型状态，"
               "数据并行时每卡 747.2 GB，8 卡专家并行时每卡约 115.9 GB；激活参数乘 16 只反映计算量，不是显存。",
               820, 430)
    # --- left: routing sketch ---
    f.text(235, 28, f"路由示意：每个 token 选 top-{K}，共 E = {E} 个专家", size=14, bold=True)
    tx, ex, bw = 40, 300, 96
    ty = [66 + i * 50 for i in range(len(ROUTES))]
    ey = [56 + j * 38 for j in range(E)]
    for i, (y, pair) in enumerate(zip(ty, ROUTES)):
        for j in pair:
            f.arrow(tx + 70, y + 13, ex - 2, ey[j] + 13, color="#7d8fa6", width=1.2)
        f.box(tx, y, 70, 26, f"token {i}", "act", size=12)
    for j, y in enumerate(ey):
        f.box(ex, y, bw, 26, f"专家 {j}（FFN）", "param", size=12)
    f.text(205, 54, "路由器：softmax → top-2", size=12, color=MUTED)
    f.text(235, 378, "输出 = Σ 门控权重 × 专家输出，按下标加回原位置", size=12, color=MUTED)
    f.text(235, 398, "每个 token 的计算只随 k 增长；每个专家的权重、梯度、优化器状态都常驻", size=12, color=MUTED)

    # --- right: model states per card ---
    x0, base, top = 470, 330, 70
    f.text(640, 28, "Mixtral-8x7B 的模型状态（16 字节/参数）", size=14, bold=True)
    bars = [
        ("数据并行", "每卡", REST, EXPERTS, False),
        (f"专家并行 {N_EP} 卡", "每卡", REST, EXPERTS / N_EP, False),
        ("激活参数 × 16", "只是计算量", REST, EXPERTS * K / E, True),
    ]
    scale = (base - top) / (BYTES * TOTAL / 1e9)
    for b, (label, sub, rest, exp, dash) in enumerate(bars):
        x = x0 + 18 + b * 108
        h_rest, h_exp = BYTES * rest / 1e9 * scale, BYTES * exp / 1e9 * scale
        f.rect(x, base - h_rest, 70, h_rest, "neutral", rx=2, dash=dash)
        f.rect(x, base - h_rest - h_exp, 70, h_exp, "param", rx=2, dash=dash)
        f.text(x + 35, base - h_rest - h_exp - 8, f"{BYTES * (rest + exp) / 1e9:.1f} GB", size=13, bold=True)
        f.text(x + 35, base + 20, label, size=12)
        f.text(x + 35, base + 37, sub, size=12, color=MUTED)
    f.line(x0 + 8, base, 806, base, color="#999999", width=1)
    f.legend(x0 + 18, 396, [("param", "专家权重部分"), ("neutral", "其余（注意力、嵌入、路由器）")], step=110)
    f.text(640, 418, f"总参数 {TOTAL / 1e9:.2f}B，激活参数 {(REST + EXPERTS * K / E) / 1e9:.2f}B（算术）",
           size=12, color=MUTED)
    return [f]
