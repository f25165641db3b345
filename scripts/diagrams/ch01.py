"""Chapter 1: the four things training keeps in VRAM, with the model states computed per parameter.

Top: bytes per parameter under mixed precision + Adam (ZeRO paper, arXiv:1910.02054 §3.1:
2Ψ + 2Ψ + 12Ψ = 16Ψ), to scale, times N = 7e9 (decimal GB, as the chapter does); under it the
common miscount 2 + 2 + 4 = 8 bytes (which is pure BF16), with the bytes it forgets drawn dashed.
Bottom: activations are not per parameter. GPT-2 small's model states from the formula beside one
training step's peak as the chapter's section-2 table gives it (simulated device, torch 2.13.0+cpu,
2026-11-29; H200 reference 7925 MiB from vramlab/data/h200_gpt2_peaks.md). ch06 compares precision
set-ups; this figure is the overview.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

N_7B = 7e9
N_GPT2 = 124_439_808
MIB = 2**20

MIXED = [("参数", 2, "param", "16 位"), ("梯度", 2, "grad", "16 位"),
         ("主权重", 4, "optim", "FP32"), ("m", 4, "optim", "FP32"), ("v", 4, "optim", "FP32")]
NAIVE = [("参数", 2, "param"), ("梯度", 2, "grad"), ("优化器", 4, "optim")]   # = pure BF16's 8 bytes

GPT2_STATES = [("参数", 4, "param"), ("梯度", 4, "grad"), ("优化器", 8, "optim")]   # FP32 + AdamW
# The chapter's section-2 table: peak composition of one steady step, b8 s512, FP32 + AdamW (MiB).
PEAK_PARTS = [("参数", 475, "param"), ("优化器", 967, "optim"), ("激活值", 4845, "act"),
              ("临时张量", 1572, "temp"), ("", 64, "temp")]   # gradients are 0 at the peak
PEAK_SIM = 7924           # the table's total (per-row rounding makes the parts sum to 7923)
PEAK_H200 = 7925


def draw() -> list[Figure]:
    total = sum(b for _, b, *_ in MIXED)
    naive = sum(b for _, b, _ in NAIVE)
    states_mib = N_GPT2 * sum(b for _, b, _ in GPT2_STATES) / MIB
    share = states_mib / PEAK_H200
    W, H = 820, 420
    f = Figure("ch01-what-fills-vram",
               f"训练时显存里的四类数据：模型状态每参数 {total} 字节，7B 模型 {total * N_7B / 1e9:.0f} GB；激活值另算",
               f"上半部分按比例画出混合精度加 Adam 每个参数的模型状态：16 位参数 2 字节、16 位梯度 2 字节、"
               f"FP32 主权重 4 字节、m 4 字节、v 4 字节，合计 {total} 字节，乘以 70 亿参数是 {total * N_7B / 1e9:.0f} GB；"
               f"下面是常见的误算 2 + 2 + 4 = {naive} 字节（{naive * N_7B / 1e9:.0f} GB），它其实是纯 BF16 的数。"
               f"下半部分：激活值不按参数算。GPT-2 small 的模型状态按公式是 {states_mib:.0f} MiB，"
               f"而批大小 8、序列 512 一步的峰值是 {PEAK_SIM} MiB，其中激活值 4845 MiB、临时张量 1572 MiB，"
               f"峰值时刻梯度为 0。", W, H)
    x0, px = 168, 26                     # bytes-per-parameter rows: 26 px per byte
    f.text(24, 30, "① 模型状态按参数算：混合精度 + Adam（ZeRO 论文 §3.1）", size=14, anchor="start", bold=True)
    f.text(W - 16, 30, f"× {N_7B / 1e9:.0f}B 参数", size=12, anchor="end", color=MUTED)

    # Row A: the correct count.
    y = 44
    f.text(x0 - 10, y + 23, "混合精度 + Adam", anchor="end", bold=True)
    x = x0
    for name, nbytes, role, dtype in MIXED:
        f.rect(x, y + 4, nbytes * px - 2, 28, role, rx=2)
        f.text(x + nbytes * px / 2 - 1, y + 23, f"{name} {nbytes}", size=12)
        if role != "optim":
            f.text(x + nbytes * px / 2 - 1, y + 48, dtype, size=12, color=MUTED)
        x += nbytes * px
    xo = x0 + 4 * px                     # bracket under the optimizer-held FP32 trio
    f.path(f"M{xo + 2},{y + 38} v5 H{x - 4} v-5", color=MUTED, width=1.2)
    f.text((xo + x) / 2, y + 58, "FP32，优化器持有：4 + 4 + 4 = 12", size=12, color=MUTED)
    f.text(x + 10, y + 23, f"{total} 字节", anchor="start", bold=True)
    f.text(W - 16, y + 23, f"{total * N_7B / 1e9:.0f} GB ≈ {total * N_7B / 2**30:.1f} GiB", anchor="end", bold=True)

    # Row B: the miscount, with what it forgets outlined.
    y = 118
    f.text(x0 - 10, y + 18, "常见误算", anchor="end", bold=True)
    f.text(x0 - 10, y + 34, "（其实是纯 BF16）", size=12, anchor="end", color=MUTED)
    x = x0
    for name, nbytes, role in NAIVE:
        f.rect(x, y + 4, nbytes * px - 2, 28, role, rx=2)
        f.text(x + nbytes * px / 2 - 1, y + 23, f"{name} {nbytes}", size=12)
        x += nbytes * px
    missing = total - naive
    f.rect(x, y + 4, missing * px - 2, 28, "free", rx=2, dash=True)
    f.text(x + missing * px / 2 - 1, y + 23, f"漏算 {missing}：主权重 4，m、v 各 2", size=12, color=MUTED)
    f.text(x0 + total * px + 10, y + 23, f"{naive} 字节", anchor="start", bold=True)
    f.text(W - 16, y + 23, f"{naive * N_7B / 1e9:.0f} GB", anchor="end", color=MUTED)
    f.text(24, y + 62, f"模型状态 = 参数量 × 每参数字节数，与批大小、序列长度无关："
           f"{N_7B / 1e9:.0f}×10⁹ × {total} 字节 = {total * N_7B / 1e9:.0f} GB，还没算激活值",
           size=12, anchor="start", color=MUTED)

    # Bottom: activations, GPT-2 small.
    top = 218
    f.text(24, top, "② 激活值不按参数算：GPT-2 small 一个训练步", size=14, anchor="start", bold=True)
    f.text(24, top + 20, f"{N_GPT2:,} 个参数，FP32 + AdamW，批大小 8，序列 512；长度按 MiB 成比例",
           size=12, anchor="start", color=MUTED)
    scale = 500 / PEAK_SIM
    y = top + 32
    f.text(x0 - 10, y + 23, "模型状态（公式）", anchor="end", bold=True)
    x = x0
    for name, nbytes, role in GPT2_STATES:
        w = N_GPT2 * nbytes / MIB * scale
        f.rect(x, y + 4, w - 1, 28, role, rx=2)
        f.text(x + w / 2, y + 23, name if w > 40 else name[:1], size=12)
        x += w
    f.text(x + 10, y + 23, f"{N_GPT2:,} × 16 字节 ≈ {states_mib:.0f} MiB", anchor="start")
    y += 44
    f.text(x0 - 10, y + 23, "一步的峰值（实测）", anchor="end", bold=True)
    x = x0
    for name, mib, role in PEAK_PARTS:
        w = mib * scale
        f.rect(x, y + 4, max(w - 1, 2), 28, role, rx=2)
        if name:
            f.text(x + w / 2, y + 23, f"{name} {mib}" if w > 90 else name, size=12)
        x += w
    f.text(x + 10, y + 23, f"{PEAK_SIM} MiB", anchor="start", bold=True)
    f.text(24, y + 56, f"峰值出现在反向刚开始：梯度为 0（上一步的已被 zero_grad 释放，这一步的还没产生），"
           f"大头是激活值和损失附近的临时张量。", size=12, anchor="start", color=MUTED)
    f.text(24, y + 76, f"模型状态总量只有峰值的 {states_mib:.0f} / {PEAK_H200} ≈ {share:.0%}"
           f"（H200 实测峰值 {PEAK_H200} MiB；分项来自本章教程第 2 节，模拟设备）。",
           size=12, anchor="start", color=MUTED)
    f.legend(24, H - 20, [("param", "参数"), ("grad", "梯度"), ("optim", "优化器状态（主权重、m、v）"),
                          ("act", "激活值"), ("temp", "临时张量与 cuBLAS 工作区")], step=0)
    return [f]
