"""Chapter 21: reading an OOM report, "too many live tensors" versus fragmentation.

The tutorial's 64 MiB virtual card: nine 6 MiB tensors carved from 20 MiB segments (the
allocator serves 1-10 MiB requests from 20 MiB segments), then every other one freed. The layout
is derived from those rules; allocated A, reserved-but-unallocated R, the largest hole and the
driver's free memory are computed from it, and match the chapter's 54/6 and 24/36 MiB.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

CARD, SEGMENT, TENSOR, COUNT, REQUEST = 64, 20, 6, 9, 12     # MiB
PER_SEG = SEGMENT // TENSOR


def layout(live):
    """Blocks per segment: (start MiB, size MiB, live?) with adjacent free blocks merged."""
    segs = []
    for s in range((COUNT + PER_SEG - 1) // PER_SEG):
        blocks = []
        for k in range(PER_SEG):
            i = s * PER_SEG + k
            if i < COUNT:
                blocks.append([k * TENSOR, TENSOR, live(i)])
        used = len(blocks) * TENSOR
        blocks.append([used, SEGMENT - used, False])
        merged = []
        for b in blocks:
            if merged and not merged[-1][2] and not b[2]:
                merged[-1][1] += b[1]
            else:
                merged.append(b)
        segs.append(merged)
    return segs


def draw() -> list[Figure]:
    f = Figure("ch21-oom-fragmentation", "64 MiB 虚拟显卡上申请 12 MiB 失败的两种情形：张量真的太多，与显存碎片",
               "上行：9 个 6 MiB 张量都活着，已分配 54 MiB、已保留未分配 6 MiB，真的不够。"
               "下行：隔一个释放一个后，已保留未分配 36 MiB，比申请的 12 MiB 还多，但每个 20 MiB 段里都还有活张量，"
               "最大的空洞只有 8 MiB，这是碎片。布局按分配器从 20 MiB 段切出 1–10 MiB 请求的规则推出。",
               820, 350)
    x0, px = 150, 10
    f.text(24, 30, f"一张 {CARD} MiB 的虚拟显卡上申请 {REQUEST} MiB（格子里的数字单位是 MiB，宽度按比例）", size=14,
           anchor="start", bold=True)
    cases = [("9 个张量都活着", lambda i: True), ("隔一个释放一个", lambda i: i % 2 == 1)]
    for r, (label, live) in enumerate(cases):
        y = 62 + r * 130
        segs = layout(live)
        f.text(x0 - 12, y + 24, label, size=13, anchor="end", bold=True)
        alloc = unalloc = hole = 0
        for s, blocks in enumerate(segs):
            sx = x0 + s * SEGMENT * px
            for start, size, alive in blocks:
                f.rect(sx + start * px + 1, y + 6, size * px - 2, 30, "act" if alive else "free", rx=2)
                f.text(sx + (start + size / 2) * px, y + 26, f"{size}", size=12, color="#222222" if alive else MUTED)
                alloc += size if alive else 0
                unalloc += 0 if alive else size
                hole = max(hole, 0 if alive else size)
            f.rect(sx, y, SEGMENT * px, 42, "neutral", rx=3, opacity=0)
            f.text(sx + SEGMENT * px / 2, y - 6, f"段 {s + 1}（{SEGMENT} MiB）", size=12, color=MUTED)
        reserved = len(segs) * SEGMENT
        f.rect(x0 + reserved * px, y + 6, (CARD - reserved) * px, 30, "idle", rx=2, dash=True)
        f.text(x0 + (reserved + CARD) / 2 * px, y + 26, f"{CARD - reserved}", size=12, color=MUTED)
        verdict = ("R < 申请，A 接近上限：活着的张量真的太多" if unalloc < REQUEST
                   else "R ≥ 申请，却没有一块连续的空间：显存碎片")
        f.text(x0, y + 62, f"已分配 A = {alloc} MiB，已保留未分配 R = {unalloc} MiB，"
               f"最大空洞 {hole} MiB，驱动空闲 {CARD - reserved} MiB", size=13, anchor="start")
        f.text(x0, y + 84, "→ " + verdict, size=13, anchor="start", bold=True)
    f.legend(24, 326, [("act", "活着的张量"), ("free", "段内空闲（已保留未分配）"), ("idle", "未保留（驱动空闲）")],
             step=190)
    f.rect(620, 314, REQUEST * px, 16, "temp", dash=True)
    f.text(620 + REQUEST * px / 2, 327, f"申请 {REQUEST} MiB", size=12)
    return [f]
