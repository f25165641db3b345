"""Chapter 27: deep prompts with a shared reparameterization MLP only save parameters when h < P.

Trainable parameters of P-Tuning v2 on the Llama-2-7B shape (L = 32, d_kv = 4096, P = 16), both
axes logarithmic: the plain per-layer prefix table P * L * 2 * d_kv, one prefix shared by all
layers P * 2 * d_kv, and peft's prefix_projection MLP as a function of its hidden size h,
P * d_kv + (d_kv + 1) * h + (h + 1) * L * 2 * d_kv. The marked points are the chapter's table.
"""
from __future__ import annotations

import math

from diagrams.svg import MUTED, Figure

P, L, D_KV = 16, 32, 4096
N_V2 = P * L * 2 * D_KV
N_SHARED = P * 2 * D_KV
TICKS = {5: "10 万", 6: "100 万", 7: "1000 万", 8: "1 亿", 9: "10 亿"}
MARKS = [4, 512, 4096]          # h values in the chapter's tables (4096 = peft's default, d_kv)


def n_proj(h):
    return P * D_KV + (D_KV + 1) * h + (h + 1) * L * 2 * D_KV


def draw() -> list[Figure]:
    f = Figure("ch27-prefix-projection", "P-Tuning v2 在 Llama-2-7B 形状上的可训练参数：不共享的前缀表、所有层共用一份、以及随隐藏维度 h 变化的重参数化 MLP",
               "双对数坐标，P = 16。不共享的前缀表是 4,194,304 个参数；重参数化 MLP 的参数约为它的 h/P 倍，"
               "只有 h 小于 P 时才更省；peft 默认 h = d_kv = 4096，得到 1,090,850,816 个（算术）。",
               820, 360)
    x0, x1, y0, y1 = 110, 600, 300, 50
    hx = (0, 12)                         # log2 h
    ly = (4.5, 9.5)                      # log10 params

    def px(h, n):
        return (x0 + (x1 - x0) * (math.log2(h) - hx[0]) / (hx[1] - hx[0]),
                y0 - (y0 - y1) * (math.log10(n) - ly[0]) / (ly[1] - ly[0]))

    f.text(410, 28, f"可训练参数（P = {P}，L = {L}，d_kv = {D_KV}）", size=14, bold=True)
    f.line(x0, y0, x1, y0, color="#999999", width=1)
    f.line(x0, y0, x0, y1, color="#999999", width=1)
    for e in range(0, 13, 2):
        f.text(px(2**e, 1e5)[0], y0 + 18, f"{2**e}", size=12, color=MUTED)
    for e in range(5, 10):
        y = px(1, 10**e)[1]
        f.line(x0 - 4, y, x1, y, color="#e3e6ea", width=1)
        f.text(x0 - 8, y + 4, TICKS[e], size=12, anchor="end", color=MUTED)
    f.text(x1, y0 + 38, "MLP 隐藏维度 h（对数坐标）", size=12, anchor="end", color=MUTED)
    for n, label, color in [(N_V2, f"不共享的前缀表 {N_V2:,}", "#4a6fa5"),
                            (N_SHARED, f"所有层共用一份 {N_SHARED:,}", "#4f8a3c")]:
        y = px(1, n)[1]
        f.line(x0, y, x1, y, color=color, width=2, dash=True)
        f.text(x1 + 8, y + 4, label, size=12, anchor="start", color=color)
    pts = [px(2 ** (k / 8), n_proj(2 ** (k / 8))) for k in range(0, 97)]
    f.path("M " + " L ".join(f"{x:.1f} {y:.1f}" for x, y in pts), color="#7a54a8", width=2.2)
    f.text(x1 + 8, px(4096, n_proj(4096))[1] + 4, "重参数化 MLP（跨层共享）", size=12, anchor="start",
           color="#7a54a8")
    for h in MARKS:
        x, y = px(h, n_proj(h))
        f.body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#e6dcf3" stroke="#7a54a8"/>')
        if h < P:
            f.text(x + 8, y + 18, f"h = {h}：{n_proj(h):,}", size=12, anchor="start")
        else:
            f.text(x - 8, y - 10, f"h = {h}：{n_proj(h):,}", size=12, anchor="end")
    xc = px(P, 1e5)[0]
    f.line(xc, y0, xc, 96, color="#999999", width=1, dash=True)
    f.text(xc + 6, y0 - 8, f"h = P = {P}", size=12, anchor="start", color=MUTED)
    f.text(x0 + 12, 66, "乘 16 字节（FP32 参数、梯度、AdamW 两个矩）：", size=12, anchor="start", color=MUTED)
    f.text(x0 + 12, 84, f"默认投影 {n_proj(4096) * 16 / 2**30:.1f} GiB，前缀表 {N_V2 * 16 / 2**20:.0f} MiB",
           size=12, anchor="start", color=MUTED)
    return [f]
