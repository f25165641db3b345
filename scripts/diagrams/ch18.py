"""Chapter 18: what a normalization layer (plus the Linear after it) keeps for backward.

One row per implementation; tile width is proportional to bytes, 1 unit = one [tokens, h] FP32
tensor. Hand-written LayerNorm keeps two new full-size tensors (x - mu and x_hat); a fused kernel
keeps x plus per-row statistics; the "save the output" variant keeps y, which the next Linear
saves anyway (shared storage). Under BF16 autocast the norm runs in FP32 and the Linear saves its
own BF16 copy of y, so saving the output no longer shares storage: one tensor for another.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

UNIT = 112   # px per unit

# (label, [(tile text, units, role, shared?)]) ; "stats" tiles are the per-row mu / rstd
ROWS = [
    ("手写 LayerNorm（FP32）", [("x − μ", 1, "act", False), ("(x − μ)·r", 1, "act", False),
                              ("stats", 0, "act", False), ("y", 1, "neutral", False)]),
    ("融合 F.layer_norm（FP32）", [("x", 1, "act", False), ("stats", 0, "act", False), ("y", 1, "neutral", False)]),
    ("存输出的省显存版（FP32）", [("y（与下一层共用）", 1, "act", True), ("stats", 0, "act", False)]),
    ("F.layer_norm，BF16 autocast", [("x 的 FP32 副本", 1, "act", False), ("stats", 0, "act", False),
                                     ("y BF16", 0.5, "neutral", False)]),
    ("存输出，BF16 autocast", [("y（FP32）", 1, "act", False), ("stats", 0, "act", False),
                              ("y BF16", 0.5, "neutral", False)]),
]


def draw() -> list[Figure]:
    f = Figure("ch18-norm-saved-tensors", "五种归一化实现各为反向保存什么：手写、融合、存输出，以及 BF16 autocast 下的情形",
               "每行是一种实现，格子宽度按字节数画，1 个单位是一个 [token 数, h] 的 FP32 张量；"
               "绿色是归一化层保存的，白色是下一个线性层为求权重梯度保存的输入 y。"
               "存输出的版本在 FP32 下与下一层共用 y，每个归一化层省 1 个单位；BF16 autocast 下两者不再共用，一换一。",
               820, 372)
    f.text(24, 32, "归一化层 → 线性层：为反向保存的张量（1 单位 = 一个 [token 数, h] 的 FP32 张量）", size=14,
           anchor="start", bold=True)
    x_tiles, y0, row_h = 262, 56, 46
    for r, (label, tiles) in enumerate(ROWS):
        y = y0 + r * row_h
        f.text(x_tiles - 12, y + 21, label, size=13, anchor="end")
        x = x_tiles
        total = 0.0
        for text, units, role, shared in tiles:
            if text == "stats":
                f.rect(x, y + 2, 8, 28, role, rx=1)
                x += 14
                continue
            w = units * UNIT
            f.rect(x, y + 2, w - 4, 28, role, dash=shared)
            f.text(x + (w - 4) / 2, y + 21, text, size=12 if w < 80 else 13)
            x += w
            total += units
        f.text(796, y + 21, f"合计 {total:g} 单位", size=13, anchor="end", bold=True)
    yl = y0 + len(ROWS) * row_h + 16
    f.legend(24, yl, [("act", "归一化层保存"), ("neutral", "下一个线性层保存的输入 y")], step=130)
    f.text(345, yl + 2, "细条：每行的 μ / rstd（[token 数, 1]，可忽略）", size=12, anchor="start", color=MUTED)
    f.text(24, yl + 26, "虚线框：归一化层存的 y 就是下一个线性层要存的那一块，只占一份", size=12, anchor="start",
           color=MUTED)
    f.text(24, yl + 48, "FP32 下存输出每个归一化层省 1 单位（每个 block 两个，即 Korthikanti 公式的 4sbh 项）；"
           "autocast 下归一化在 FP32 中运行，省不下来", size=12, anchor="start", color=MUTED)
    return [f]
