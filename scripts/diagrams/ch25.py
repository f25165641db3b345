"""Chapter 25: DoRA splits a weight into magnitude and direction; AdaLoRA prunes ranks on a schedule.

Figure 1: W' = m * (W0 + s B A) / ||W0 + s B A|| (row norms, detached), and what it costs: two
extra saved activations per adapted layer, 2 * B * S * bytes * sum(d_out), computed for the
chapter's Llama-2-7B example. Figure 2: AdaLoRA's budget schedule b(t) (warm-up, cubic decay,
final phase) for the chapter's peft example: init_r = 12, target_r = 8, tinit = 5, tfinal = 15,
deltaT = 5, total_step = 40, plotted as the average rank per adapted matrix.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

# Llama-2-7B shape, BF16 saved tensors, batch 1, sequence 2048 (the chapter's example)
LAYERS, BATCH, SEQ, BYTES = 32, 1, 2048, 2
D_OUT_ALL = 4 * 4096 + 2 * 11008 + 4096       # q, k, v, o, gate, up, down
D_OUT_QV = 2 * 4096

INIT_R, TARGET_R, TINIT, TFINAL, DELTA_T, TOTAL = 12, 8, 5, 15, 5, 40


def dora_extra(d_out_sum):
    return 2 * LAYERS * BATCH * SEQ * BYTES * d_out_sum


def budget(t):
    """Average rank per matrix, b(t) / n, from the chapter's three-phase formula."""
    if t <= TINIT:
        return INIT_R
    if t > TOTAL - TFINAL:
        return TARGET_R
    frac = 1 - (t - TINIT) / (TOTAL - TINIT - TFINAL)
    return TARGET_R + (INIT_R - TARGET_R) * frac ** 3


def _dora() -> Figure:
    f = Figure("ch25-dora", "DoRA 把权重拆成幅度向量 m 和方向两部分，方向用 LoRA 更新、范数当作常数；以及它多保存的激活值",
               "W0 的每一行拆成长度 m（可训练）和单位方向；方向为 W0 + s·B·A 再按行归一化，范数从计算图上摘下。"
               "因为 m 要梯度，每个被适配的层多保存两个 B×S×d_out 的张量；按本章公式算，Llama-2-7B 全部线性层、"
               "批大小 1、序列长度 2048、BF16 时多 10.375 GiB。",
               820, 330)
    f.text(410, 30, "W' = m ⊙ (W0 + s·B·A) / ‖W0 + s·B·A‖", size=15, bold=True, mono=True)
    f.box(24, 96, 110, 60, "W0（冻结）", "param", size=14)
    f.box(190, 60, 150, 40, "m：d_out 个长度", "grad", size=12)
    f.box(190, 150, 150, 40, "方向 V = W0 + s·B·A", "param", size=12)
    f.box(190, 210, 150, 32, "B·A（LoRA，可训练）", "grad", size=12)
    f.box(396, 150, 150, 40, "按行除以 ‖V‖", "neutral", size=13)
    f.box(600, 100, 110, 50, "W' = m ⊙ 方向", "act", size=12)
    f.arrow(134, 112, 188, 82)
    f.text(152, 88, "初始化", size=12, color=MUTED)
    f.arrow(134, 140, 188, 166)
    f.arrow(265, 210, 265, 192)
    f.arrow(340, 170, 394, 170)
    f.arrow(546, 165, 598, 135)
    f.arrow(340, 80, 598, 118)
    f.text(471, 212, "‖V‖ 当作常数（detach）", size=12, color=MUTED)
    y = 270
    f.text(24, y, "多出的激活值：m 要梯度，每层多存 base_result 和 lora_result·s，各 B×S×d_out", size=13,
           anchor="start", bold=True)
    for k, (label, d) in enumerate([("全部 7 种线性层", D_OUT_ALL), ("只适配 q_proj、v_proj", D_OUT_QV)]):
        f.text(24 + k * 400, y + 26,
               f"Llama-2-7B，{label}：{dora_extra(d) / 2**30:g} GiB", size=13, anchor="start")
    f.text(24, y + 48, f"（B = {BATCH}，S = {SEQ}，BF16；与秩 r 无关，随 B×S 和被适配层的输出维度之和增长）", size=12,
           anchor="start", color=MUTED)
    return f


def _adalora() -> Figure:
    f = Figure("ch25-adalora-budget", "AdaLoRA 的预算调度：热身不剪，按三次方曲线从 init_r 降到 target_r，最后固定",
               "横轴是训练步数，纵轴是平均每个被适配矩阵保留的秩 b(t)/n。按本章 peft 示例的设置："
               "init_r = 12、target_r = 8、tinit = 5、tfinal = 15、总步数 40；圆点是每 ΔT = 5 步按预算剪一次秩的时刻。",
               820, 300)
    x0, x1, y0, y1 = 90, 780, 250, 60            # plot box: t in [0, TOTAL], rank in [6, 13]
    lo, hi = 6, 13

    def px(t, r):
        return x0 + (x1 - x0) * t / TOTAL, y0 - (y0 - y1) * (r - lo) / (hi - lo)

    f.text(410, 30, f"预算调度 b(t)/n（init_r = {INIT_R}，target_r = {TARGET_R}，T = {TOTAL}）", size=14, bold=True)
    f.rect(x0, y1, px(TINIT, 0)[0] - x0, y0 - y1, "free", rx=0, opacity=0.6)
    f.rect(px(TOTAL - TFINAL, 0)[0], y1, x1 - px(TOTAL - TFINAL, 0)[0], y0 - y1, "free", rx=0, opacity=0.6)
    f.text((x0 + px(TINIT, 0)[0]) / 2, y0 - 12, "热身", size=12, color=MUTED)
    f.text((px(TOTAL - TFINAL, 0)[0] + x1) / 2, y0 - 12, f"固定最后 {TFINAL} 步", size=12, color=MUTED)
    pts = [px(t / 4, budget(t / 4)) for t in range(TOTAL * 4 + 1)]
    f.path("M " + " L ".join(f"{x:.1f} {y:.1f}" for x, y in pts), color="#7a54a8", width=2.2)
    for t in range(DELTA_T, TOTAL + 1, DELTA_T):
        if TINIT < t <= TOTAL - TFINAL:
            x, y = px(t, budget(t))
            f.body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#e6dcf3" stroke="#7a54a8"/>')
    f.line(x0, y0, x1, y0, color="#999999", width=1)
    f.line(x0, y0, x0, y1, color="#999999", width=1)
    for t in range(0, TOTAL + 1, 5):
        f.text(px(t, lo)[0], y0 + 18, str(t), size=12, color=MUTED)
    for r in range(lo, hi + 1):
        f.text(x0 - 8, px(0, r)[1] + 4, str(r), size=12, anchor="end", color=MUTED)
    f.text(x1, y0 + 38, "训练步数 t", size=12, anchor="end", color=MUTED)
    f.text(x0 - 58, y1 - 14, "平均每个矩阵的秩", size=12, anchor="start", color=MUTED)
    return f


def draw() -> list[Figure]:
    return [_dora(), _adalora()]
