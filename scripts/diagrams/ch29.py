"""Chapter 29: what each sharding / offload switch removes from one card's model states.

Llama-7B shape (6,738,415,616 parameters), 8 data-parallel cards, mixed precision + Adam
(2 + 2 + 12 bytes per parameter), per-card model states from the ZeRO formulas, stacked by kind.
Offload rows keep on the card only what the chapter's table says: 2 Psi for stage 2 with
offload_optimizer, 4 L (the largest layer gathered in 16 bits, L = 131,072,000) for stage 3 with
both offloads.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

PSI, N, K = 6_738_415_616, 8, 12
LARGEST = 32000 * 4096          # word embedding, the largest layer
GIB = 2**30

ROWS = [
    ("不分片（DDP）", "16Ψ", [(2 * PSI, "param"), (2 * PSI, "grad"), (K * PSI, "optim")]),
    ("ZeRO-1：切优化器状态", "4Ψ + 12Ψ/N", [(2 * PSI, "param"), (2 * PSI, "grad"), (K * PSI / N, "optim")]),
    ("ZeRO-2：再切梯度", "2Ψ + 14Ψ/N", [(2 * PSI, "param"), (2 * PSI / N, "grad"), (K * PSI / N, "optim")]),
    ("ZeRO-3：再切参数", "16Ψ/N", [(2 * PSI / N, "param"), (2 * PSI / N, "grad"), (K * PSI / N, "optim")]),
    ("ZeRO-2 + offload_optimizer", "2Ψ", [(2 * PSI, "param")]),
    ("ZeRO-3 + 两种 offload", "4L", [(4 * LARGEST, "temp")]),
]


def draw() -> list[Figure]:
    f = Figure("ch29-zero-per-card", "Llama-7B、8 张卡时各个分片与卸载开关下每张卡的模型状态，按参数、梯度、优化器状态分段",
               "按 ZeRO 公式算出（混合精度 + Adam，每参数 2 + 2 + 12 字节）：不分片 100.41 GiB，ZeRO-1 34.52 GiB，"
               "ZeRO-2 23.53 GiB，ZeRO-3 12.55 GiB；ZeRO-2 卸载优化器状态后剩 16 位参数 12.55 GiB，"
               "ZeRO-3 两种卸载都开时只剩全收集的最大一层 0.49 GiB。",
               820, 372)
    f.text(24, 30, f"每张卡的模型状态（Ψ = {PSI:,}，N = {N}）", size=14, anchor="start", bold=True)
    x0, row_h, y0 = 240, 42, 52
    px = 440 / (16 * PSI)
    for r, (label, formula, segs) in enumerate(ROWS):
        y = y0 + r * row_h
        f.text(x0 - 10, y + 18, label, size=13, anchor="end")
        f.text(x0 - 10, y + 33, formula, size=12, anchor="end", color=MUTED)
        x = x0
        for nbytes, role in segs:
            w = max(nbytes * px, 1.5)
            f.rect(x, y + 6, w, 24, role, rx=2)
            x += w
        total = sum(b for b, _ in segs)
        f.text(x + 8, y + 23, f"{total / GIB:.2f} GiB", size=13, anchor="start", bold=True)
    yl = y0 + len(ROWS) * row_h + 22
    f.legend(24, yl, [("param", "16 位参数"), ("grad", "16 位梯度"), ("optim", "主权重 + m + v"),
                      ("temp", "全收集的最大一层")], step=150)
    f.text(24, yl + 26, "卸载的两行：优化器状态与更新（以及 ZeRO-3 的参数）放在主存，每步经 PCIe 来回搬运", size=12,
           anchor="start", color=MUTED)
    return [f]
