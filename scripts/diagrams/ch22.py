"""Chapter 22: group-wise quantization (integer codes + one scale per group) and bytes per weight.

Top: one weight row cut into groups of g values, each group stores b-bit codes and one scale
(sketch with g = 4). Bottom: bytes per weight, b/8 + b_s/g (+ b_z/g), drawn to scale for the
chapter's formats, split into the codes and the scale/zero-point/absmax overhead, and the total
for 7 x 10^9 weights in GB.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

N = 7e9
# (label, code bytes, overhead bytes): the chapter's formula, FP16 scales unless noted
FORMATS = [
    ("FP32", 4, 0),
    ("FP16 / BF16", 2, 0),
    ("INT8 逐通道（每行 4096）", 1, 2 / 4096),
    ("INT4 分组 g = 128", 0.5, 2 / 128),
    ("INT4 g = 128 + 零点", 0.5, 4 / 128),
    ("NF4 块 64（FP32 absmax）", 0.5, 4 / 64),
    ("NF4 块 64 + 双重量化", 0.5, 1 / 64 + 4 / (64 * 256)),
]


def draw() -> list[Figure]:
    f = Figure("ch22-group-quant-bytes", "分组量化的存储方式（每组整数码加一个缩放系数），以及各种格式每个权重的字节数和 7B 权重总量",
               "上：一行权重按每 g 个一组，每组存 b 位整数码和一个缩放系数 s，反量化为 s·q。"
               "下：按 b/8 + b_s/g 算出的每个权重字节数，分成整数码和缩放系数等开销两部分，右侧乘以 70 亿个参数。",
               820, 452)
    # --- top: one row, groups of 4 (sketch) ---
    g, groups = 4, 4
    f.text(24, 30, "一行权重按组量化（示意：g = 4；常用 g = 64 或 128）", size=14, anchor="start", bold=True)
    x, y = 40, 46
    codes = [[3, -7, 1, 5], [0, 2, -1, 7], [-4, 6, -7, 1], [7, -2, 0, 3]]
    for k in range(groups):
        for j in range(g):
            f.box(x + j * 34, y, 32, 26, str(codes[k][j]), "param", size=12)
        f.box(x + g * 34 + 2, y, 34, 26, f"s{k}", "temp", size=12)
        f.text(x + (g * 34 + 36) / 2, y + 44, f"第 {k + 1} 组", size=12, color=MUTED)
        x += g * 34 + 36 + 14
    f.text(24, 118, "每个元素 b 位整数码，每组一个 b_s 字节的缩放系数（有零点时再加 b_z）：", size=13, anchor="start")
    f.text(24, 140, "字节/元素 = b/8 + (b_s + b_z)/g；反量化得到 s·q（零点映射为 s·(q − z)）", size=13,
           anchor="start", bold=True)

    # --- bottom: bytes per weight ---
    top, row_h, x0, px = 178, 34, 230, 100
    f.text(24, top - 10, "每个权重的字节数（按比例）", size=14, anchor="start", bold=True)
    f.text(796, top - 10, "70 亿个权重", size=12, anchor="end", color=MUTED)
    for r, (label, code, extra) in enumerate(FORMATS):
        y = top + r * row_h
        f.text(x0 - 10, y + 19, label, size=13, anchor="end")
        f.rect(x0, y + 3, code * px, 22, "param", rx=2)
        if extra:
            f.rect(x0 + code * px, y + 3, max(extra * px, 1.5), 22, "temp", rx=1)
        total = code + extra
        f.text(x0 + total * px + 8, y + 19, f"{total:.4f}" if extra else f"{total:g}", size=13, anchor="start",
               bold=True)
        f.text(796, y + 19, f"{total * N / 1e9:.2f} GB", size=13, anchor="end")
    yl = top + len(FORMATS) * row_h + 20
    f.legend(24, yl, [("param", "整数码（或浮点数本身）"), ("temp", "缩放系数 / 零点 / absmax 的开销")], step=190)
    f.text(796, yl + 2, "算术：嵌入层和输出层也按同样格式计", size=12, anchor="end", color=MUTED)
    return [f]
