"""Ch02: the three ledgers drawn as one bar: allocated <= reserved <= process (nvidia-smi).

Numbers: H200 reference table, baseline GPT-2 small b8 s512 FP32 + AdamW (vramlab/data/h200_gpt2_peaks.md):
allocated peak 7925 MiB, reserved peak 8576 MiB; CUDA context "about 600-700 MiB" from the same source.
Segment widths are computed from these numbers; the context's uncertain part is drawn dashed.
"""
from diagrams.svg import MUTED, Figure

ALLOCATED, RESERVED = 7925, 8576          # MiB, H200 measured
CONTEXT_LO, CONTEXT_HI = 600, 700         # MiB, H200 "约 600–700 MiB"


def bracket(fig, x1, x2, y, label):
    fig.path(f"M{x1:.1f},{y - 8} L{x1:.1f},{y} L{x2:.1f},{y} L{x2:.1f},{y - 8}", width=1.2)
    fig.text(x1 + 6, y + 17, label, anchor="start")


def draw():
    W, x0, bar_w = 760, 40, 660
    scale = bar_w / (RESERVED + CONTEXT_HI)               # px per MiB
    xa, xr = x0 + ALLOCATED * scale, x0 + RESERVED * scale
    xc_lo, xc_hi = xr + CONTEXT_LO * scale, xr + CONTEXT_HI * scale
    f = Figure("ch02-three-ledgers", "三本账：已分配 ≤ 已保留 ≤ nvidia-smi 看到的进程占用",
               "按 H200 基线配置（GPT-2 small，批大小 8，序列长度 512，FP32 + AdamW）的实测峰值画成一根横条："
               "已分配 7925 MiB，加上缓存里的空闲块是已保留 8576 MiB，再加上约 600–700 MiB 的 CUDA 上下文才是 nvidia-smi 的读数。",
               W, 262)
    y, h = 70, 40
    f.rect(x0, y, xa - x0, h, "param")
    f.rect(xa, y, xr - xa, h, "free")
    f.rect(xr, y, xc_lo - xr, h, "neutral")
    f.rect(xc_lo, y, xc_hi - xc_lo, h, "neutral", dash=True)
    f.text((x0 + xa) / 2, y + h / 2 + 5, f"张量占用的块（已分配）{ALLOCATED} MiB")
    # labels of the two narrow segments sit above the bar, staggered, with leader lines
    f.line((xa + xr) / 2, y, (xa + xr) / 2, 48, color=MUTED, width=1)
    f.text((xa + xr) / 2 + 4, 44, f"缓存里的空闲块 {RESERVED - ALLOCATED} MiB", anchor="end")
    f.line((xr + xc_hi) / 2, y, (xr + xc_hi) / 2, 22, color=MUTED, width=1)
    f.text((xr + xc_hi) / 2 + 4, 18, f"CUDA 上下文 约 {CONTEXT_LO}–{CONTEXT_HI} MiB", anchor="end")
    bracket(f, x0, xa, 140, f"torch.cuda.max_memory_allocated()：已分配峰值 {ALLOCATED} MiB")
    bracket(f, x0, xr, 180, f"torch.cuda.max_memory_reserved()：已保留峰值 {RESERVED} MiB")
    bracket(f, x0, xc_hi, 220, "nvidia-smi / NVML：进程占用 ≈ 上下文 + 已保留 ≈ "
            f"{RESERVED + CONTEXT_LO}–{RESERVED + CONTEXT_HI} MiB")
    f.text(W - 20, 252, "H200 实测，PyTorch 2.11；横向按 MiB 等比例", size=12, anchor="end", color=MUTED)
    return [f]
