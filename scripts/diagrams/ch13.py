"""Ch13: searching the largest batch size by doubling then bisection, and the first-step trap.

The trial sequence is computed by running the search against the tutorial's outcomes on a 144 MiB
virtual card (tiny GPT-2, seq 64, simulated device, torch 2.13.0+cpu, 2026-11-29): with 2 steps per
trial every b <= 21 passes; with only 1 step every b <= 27 "passes" (27 then OOMs at step 2 in training).
"""
from diagrams.svg import MUTED, PALETTE, Figure

LIMITS = [("每次试探跑 2 步", 21), ("只跑 1 步", 27)]     # the largest batch each kind of trial lets through


def search(fits, start=1):
    """Doubling until the first failure, then bisection between the last pass and the first fail."""
    trials, b = [], start
    while True:
        trials.append((b, fits(b)))
        if not trials[-1][1]:
            break
        b *= 2
    lo, hi = b // 2, b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = fits(mid)
        trials.append((mid, ok))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return trials, lo


def draw():
    W, H, x0, sx = 780, 282, 60, 20
    X = lambda b: x0 + b * sx
    f = Figure("ch13-batch-search", "倍增加二分搜索最大批大小：每次试探只跑 1 步会选出一个第 2 步就 OOM 的批",
               "在 144 MiB 的虚拟显卡上，先按 1、2、4、8… 倍增到第一次 OOM，再在最后一次通过和第一次失败之间二分：每次试 2 步，10 次试探找到 21；"
               "只试 1 步时，反向的 cuBLAS 工作区和优化器状态在第一步的峰值时刻还不存在，没被算进去，找到的 27 拿去训练第 2 步就 OOM。", W, H)
    for k, (title, limit) in enumerate(LIMITS):
        y = 60 + k * 104
        trials, best = search(lambda b: b <= limit)
        f.text(20, y - 26, f"{title}：{len(trials)} 次试探，结果 {best}", anchor="start", bold=True)
        f.line(X(0), y, X(34), y, width=1)
        for b in (1, 2, 4, 8, 16, 24, 32):
            f.line(X(b), y, X(b), y + 5, width=1)
            f.text(X(b), y + 19, str(b), size=12, color=MUTED)
        lift = {}
        for i, (b, ok) in enumerate(trials):
            fill, stroke = PALETTE["act" if ok else "comm"]
            f.body.append(f'<circle cx="{X(b):.1f}" cy="{y}" r="8" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
            dy = lift.setdefault(b, 0)
            f.text(X(b), y - 13 - dy, str(i + 1), size=12, bold=True)
            lift[b] += 14
        f.text(X(best), y + 38, f"↑ {best}", size=13, bold=True)
    f.text(X(27) + 28, 60 + 104 + 38, "拿 27 训练：第 2 步 OOM", anchor="start", size=12, color=PALETTE["comm"][1])
    f.text(X(21) + 28, 60 + 38, "拿 21 训练 3 步：都通过", anchor="start", size=12, color=PALETTE["act"][1])
    f.legend(20, H - 14, [("act", "通过"), ("comm", "OOM")])
    f.text(150, H - 12, "圆点上的数字 = 试探顺序；横轴 = 批大小", anchor="start", size=12, color=MUTED)
    return [f]
