"""Ch07: the recompute schedule of per-block checkpointing vs none, as block activations over one step.

Model from the chapter: L = 12 GPT-2 blocks, each saves 28 units inside (1 unit = one [b, s, h] FP32
tensor = 4bsh bytes), a checkpoint keeps only the block input (1 unit); forward costs F = 1 per block,
backward 2F. Without checkpoints the peak is 28L units; with them L + 28 (M(k) = L/k + 28k, k = 1), and every
block is recomputed once (+F each). Curves and time axis are computed from these rules.
"""
from diagrams.svg import EDGE, MUTED, PALETTE, Figure

L, INSIDE = 12, 28
B, S, H = 8, 512, 768                                  # GPT-2 small, b8 s512 -> 1 unit = 12 MiB


def no_checkpoint():
    pts = [(i, INSIDE * i) for i in range(L + 1)]
    return pts + [(L + 2 * j, INSIDE * (L - j)) for j in range(1, L + 1)]


def per_block():
    pts, t = [(i, i) for i in range(L + 1)], L
    for i in reversed(range(L)):                       # block i: recompute (F), then backward (2F)
        pts += [(t + 1, i + 1 + INSIDE), (t + 3, i)]
        t += 3
    return pts


def draw():
    unit_mib = 4 * B * S * H / 2**20
    W, x0, y0, sx, sy = 780, 70, 250, 13.0, 200 / (INSIDE * L)
    f = Figure("ch07-recompute-schedule", "一个训练步里 12 个 block 的激活值：不做检查点与每个 block 一个检查点",
               f"不做检查点时激活值在前向中堆到 {INSIDE * L} 个单位；每个 block 一个检查点时前向只存 {L} 个 block 输入，"
               "反向时每个 block 先重算（冒出一个 28 单位的小尖峰）再反向，峰值约 40 个单位，代价是多做一次前向。", W, 318)

    def poly(pts, role):
        fill, stroke = PALETTE[role]
        d = "M" + " L".join(f"{x0 + t * sx:.1f},{y0 - m * sy:.1f}" for t, m in pts)
        f.path(d + f" L{x0 + pts[-1][0] * sx:.1f},{y0} L{x0},{y0} Z", color=stroke, width=1.5, fill=fill)

    poly(no_checkpoint(), "act")
    poly(per_block(), "temp")
    t_end = per_block()[-1][0]
    f.line(x0, y0, x0 + t_end * sx + 10, y0, width=1)
    f.line(x0, y0, x0, y0 - INSIDE * L * sy - 10, width=1)
    for v in (0, 100, 200, 300):
        f.text(x0 - 6, y0 - v * sy + 4, str(v), anchor="end", size=12, color=MUTED)
    f.text(x0 - 6, 28, "单位", anchor="end", size=12, color=MUTED)
    for t, label in [(L, f"前向结束 {L}F"), (3 * L, f"{3 * L}F"), (t_end, f"{t_end}F")]:
        f.line(x0 + t * sx, y0, x0 + t * sx, y0 + 6, width=1)
        f.text(x0 + t * sx, y0 + 20, label, size=12, color=MUTED)
    peak = INSIDE * L
    f.text(x0 + L * sx + 8, y0 - peak * sy + 4, f"不做检查点：峰值 {peak} 单位 ≈ {peak * unit_mib:.0f} MiB", anchor="start")
    ck = L + INSIDE
    f.arrow(555, 118, x0 + (L + 1) * sx + 4, y0 - ck * sy - 4, color=EDGE)
    f.text(560, 100, "每个 block 一个检查点：", anchor="start")
    f.text(560, 120, f"峰值约 {ck} 单位 ≈ {ck * unit_mib:.0f} MiB", anchor="start")
    f.text(x0 + 41 * sx, y0 - ck * sy - 14, "每个 block：重算 1F + 反向 2F", size=12)
    f.legend(x0, 296, [("act", "不做检查点"), ("temp", "每个 block 一个检查点（含重算尖峰）")])
    f.text(W - 16, 300, f"1 单位 = 4bsh 字节 = {unit_mib:.0f} MiB（b = {B}，s = {S}，h = {H}）", size=12,
           anchor="end", color=MUTED)
    return [f]
