"""Chapter 19: bytes per parameter of the model states for common optimizer set-ups.

Stacked bars, one segment per tensor kind (parameter, gradient, FP32 master weight, m, v), drawn
to scale from the chapter's table; the 8-bit row adds each block's FP32 absmax (block = 2048).
The right column multiplies by GPT-2 small's 124,439,808 parameters.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

N_GPT2 = 124_439_808
BLOCK = 2048
Q8 = 1 + 4 / BLOCK        # one 8-bit code per value + one FP32 absmax per block

# (label, [(segment, bytes, role)])
ROWS = [
    ("FP32 + SGD", [("参数", 4, "param"), ("梯度", 4, "grad")]),
    ("FP32 + SGD（动量）", [("参数", 4, "param"), ("梯度", 4, "grad"), ("动量", 4, "optim")]),
    ("FP32 + AdamW", [("参数", 4, "param"), ("梯度", 4, "grad"), ("m", 4, "optim"), ("v", 4, "optim")]),
    ("混合精度 + Adam", [("参数", 2, "param"), ("梯度", 2, "grad"), ("主权重", 4, "optim"), ("m", 4, "optim"),
                      ("v", 4, "optim")]),
    ("纯 BF16 + AdamW", [("参数", 2, "param"), ("梯度", 2, "grad"), ("m", 2, "optim"), ("v", 2, "optim")]),
    ("FP32 + 8-bit AdamW", [("参数", 4, "param"), ("梯度", 4, "grad"), ("m", Q8, "optim"), ("v", Q8, "optim")]),
]


def draw() -> list[Figure]:
    f = Figure("ch19-bytes-per-param", "六种训练方式下每个参数的模型状态字节数：参数、梯度、主权重与优化器状态",
               "堆叠条按比例画出每个参数占的字节：FP32 + AdamW 与混合精度 + Adam 都是 16 字节，"
               "8-bit AdamW 把 m、v 各压到 1 字节加每 2048 个数一个 FP32 absmax，约 10 字节；右侧乘上 GPT-2 small 的参数量。",
               820, 372)
    f.text(24, 32, "每个参数的模型状态（字节）", size=14, anchor="start", bold=True)
    f.text(796, 32, "GPT-2 small 合计", size=12, anchor="end", color=MUTED)
    x0, px, y0, row_h = 196, 27, 52, 40
    for r, (label, segs) in enumerate(ROWS):
        y = y0 + r * row_h
        f.text(x0 - 12, y + 20, label, size=13, anchor="end")
        x = x0
        for name, nbytes, role in segs:
            w = nbytes * px
            f.rect(x, y + 2, w, 28, role, rx=2)
            f.text(x + w / 2, y + 21, name if w >= 26 else name[:1], size=12)
            x += w
        total = sum(b for _, b, _ in segs)
        f.text(x + 8, y + 21, f"≈ {total:.3f} 字节" if total != int(total) else f"{total:g} 字节", size=13,
               anchor="start", bold=True)
        f.text(796, y + 21, f"{total * N_GPT2 / 2**20:,.1f} MiB", size=12, anchor="end", color=MUTED)
    for b in range(0, 17, 4):
        xb = x0 + b * px
        f.line(xb, y0 + len(ROWS) * row_h, xb, y0 + len(ROWS) * row_h + 5, color="#999999", width=1)
        f.text(xb, y0 + len(ROWS) * row_h + 20, str(b), size=12, color=MUTED)
    yl = y0 + len(ROWS) * row_h + 46
    f.legend(24, yl, [("param", "参数"), ("grad", "梯度"), ("optim", "优化器状态（主权重、m、v、动量）")], step=90)
    f.text(24, yl + 26, f"8-bit 的 m、v：每个数 1 字节，每 {BLOCK} 个数一块、每块一个 FP32 absmax，"
           f"即 1 + 4/{BLOCK} ≈ {Q8:.3f} 字节", size=12, anchor="start", color=MUTED)
    return [f]
