"""Chapter 30: the case study's ladder, one technique per level, until GPT-2 small fits in 2 GiB.

Bars are the chapter's measured peaks (tutorial, GPT-2 small, batch 8, sequence 512, simulated
device, FakeTensorMode, torch 2.13.0+cpu, 2026-11-30): max_memory_allocated in front,
max_memory_reserved behind, against the 2 GiB budget. A level fits only if the reserved peak does.
"""
from __future__ import annotations

from diagrams.svg import MUTED, PALETTE, Figure

BUDGET = 2048   # MiB
# (level, technique, allocated MiB, reserved MiB): the chapter's table
LADDER = [
    (0, "基线 FP32", 7924.0, 8584.0),
    (1, "BF16 autocast", 7136.9, 7450.0),
    (2, "8-bit AdamW", 6437.8, 6682.0),
    (3, "梯度累积 ×2", 4225.8, 4550.0),
    (4, "分块交叉熵", 3503.1, 3720.0),
    (5, "激活检查点", 1878.2, 2178.0),
    (6, "优化器状态卸载", 1146.7, 1910.0),
    (7, "激活值卸载", 1062.7, 1616.0),
]


def draw() -> list[Figure]:
    f = Figure("ch30-ladder", "综合案例的梯子：GPT-2 small 每加一种技术后的已分配峰值与已保留峰值，对照 2 GiB 的显存预算",
               "本章教程在模拟设备上测得（GPT-2 small，批大小 8，序列长度 512，torch 2.13.0+cpu，2026-11-30）："
               "从基线的 7924.0 MiB 已分配、8584.0 MiB 已保留，逐级降到 1062.7 MiB 和 1616.0 MiB；"
               "第 5 级已分配 1879.2 MiB 已低于 2048 MiB，但已保留 2178.0 MiB 超出预算，仍然 OOM，第 6 级才跑通。",
               820, 408)
    x0, base, top, step = 40, 316, 84, 96
    scale = (base - top) / max(r for *_, r in LADDER)
    f.text(24, 30, "每加一种技术后的峰值（MiB，模拟设备实测）", size=14, anchor="start", bold=True)
    yb = base - BUDGET * scale
    for level, name, alloc, reserved in LADDER:
        x = x0 + level * step
        f.rect(x + 8, base - reserved * scale, 70, reserved * scale, "free", rx=2)
        f.rect(x + 16, base - alloc * scale, 54, alloc * scale, "act", rx=2)
    f.line(x0, base, x0 + len(LADDER) * step, base, color="#999999", width=1)
    f.line(x0, yb, x0 + len(LADDER) * step, yb, color=PALETTE["comm"][1], width=1.5, dash=True)
    for level, name, alloc, reserved in LADDER:
        x = x0 + level * step
        f.text(x + 43, base - reserved * scale - 22, f"{alloc:.1f}", size=12, bold=True)
        f.text(x + 43, base - reserved * scale - 7, f"保留 {reserved:.0f}", size=12, color=MUTED)
        f.text(x + 43, base + 18, f"第 {level} 级", size=12)
        f.text(x + 43, base + 35, name, size=12)
        fits = reserved <= BUDGET
        f.text(x + 43, base + 53, "跑通" if fits else "OOM", size=12, bold=True,
               color=PALETTE["act"][1] if fits else PALETTE["comm"][1])
    f.line(600, 388, 630, 388, color=PALETTE["comm"][1], width=1.5, dash=True)
    f.text(636, 392, f"预算 2 GiB（{BUDGET} MiB）", size=12, anchor="start", color=PALETTE["comm"][1])
    f.legend(24, 390, [("act", "已分配峰值 max_memory_allocated"), ("free", "已保留峰值 max_memory_reserved")],
             step=280)
    return [f]
