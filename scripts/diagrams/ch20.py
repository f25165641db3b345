"""Chapter 20: DDP overlaps each gradient bucket's all-reduce with the rest of the backward pass.

A schematic timeline (arbitrary time units, not a measurement): 6 layers, 1 unit of backward
each, grouped into 3 buckets of 2 layers. A bucket's all-reduce starts on the NCCL stream when
its last gradient is ready and the previous all-reduce is done. The thin bars show how long each
bucket's gradients stay "in flight" (ready but not yet reduced): on a slow link they live longer
and the tail after the backward pass grows, T_step ~ max(T_backward, T_comm) + T_tail.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

LAYERS, PER_BUCKET = 6, 2
SCENARIOS = [("快链路：每个桶通信 1.2 个单位", 1.2), ("慢链路：每个桶通信 2.6 个单位", 2.6)]


def schedule(comm):
    """(ready, start, end) of each bucket's all-reduce; backward layer i takes [i, i+1)."""
    out, free_at = [], 0.0
    for b in range(LAYERS // PER_BUCKET):
        ready = (b + 1) * PER_BUCKET
        start = max(ready, free_at)
        free_at = start + comm
        out.append((ready, start, free_at))
    return out


def draw() -> list[Figure]:
    f = Figure("ch20-bucket-overlap", "DDP 的梯度桶在反向传播中逐个发起全规约：快链路与慢链路的时间线示意",
               "示意图，时间单位任意：6 层反向各 1 个单位，每 2 层一个桶，桶就绪后在 NCCL 流上全规约。"
               "细条是每个桶的梯度从就绪到通信完成的在途时间；链路慢时在途更久，反向结束后的尾部也更长。",
               820, 420)
    x0, px = 150, 60
    for k, (title, comm) in enumerate(SCENARIOS):
        y = 44 + k * 180
        sched = schedule(comm)
        end = sched[-1][2]
        f.text(24, y, title, size=14, anchor="start", bold=True)
        f.text(x0 - 10, y + 34, "计算流（反向）", size=12, anchor="end")
        for i in range(LAYERS):
            f.box(x0 + i * px, y + 16, px - 3, 26, f"层 {LAYERS - i}", "neutral", size=12)
        f.text(x0 - 10, y + 72, "NCCL 流", size=12, anchor="end")
        f.text(x0 - 10, y + 108, "在途的梯度桶", size=12, anchor="end")
        for b, (ready, start, stop) in enumerate(sched):
            f.box(x0 + start * px, y + 54, (stop - start) * px - 3, 26, f"桶 {b + 1} 全规约", "comm", size=12)
            f.rect(x0 + ready * px, y + 92 + b * 9, (stop - ready) * px - 3, 7, "grad", rx=2)
        f.line(x0 + LAYERS * px, y + 10, x0 + LAYERS * px, y + 122, dash=True, color="#999999", width=1)
        busy = max(sum(r <= t < e for r, _, e in sched) for t, _, _ in sched)
        f.text(796, y + 108, f"同时在途最多 {busy} 个桶", size=12, anchor="end", color=MUTED)
        if end > LAYERS:
            f.text(x0 + (LAYERS + end) / 2 * px, y + 136, f"尾部 {end - LAYERS:.1f}", size=12, color=MUTED)
        f.text(796, y, f"一步的反向 + 通信 ≈ {end:.1f} 单位", size=13, anchor="end", bold=True)
    f.legend(24, 404, [("neutral", "反向计算"), ("comm", "全规约（NCCL 流）"), ("grad", "桶：已就绪、未规约完")],
             step=150)
    f.text(796, 404, "虚线：反向结束", size=12, anchor="end", color=MUTED)
    return [f]
