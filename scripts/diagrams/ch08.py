"""Ch08: Ring AllReduce on N = 4 GPUs: what each rank holds after reduce-scatter and after all-gather.

The chunk states are computed by simulating the ring (each step every rank sends one chunk of S/N to its
right neighbour; first N-1 steps add, next N-1 steps overwrite). Each rank sends 2(N-1)/N * S in total.
"""
import math

from diagrams.svg import EDGE, MUTED, Figure

N = 4


def ring_states(n):
    """[start, after reduce-scatter, after all-gather]; state[r][c] = set of ranks summed into chunk c on rank r."""
    s = [[{r} for _ in range(n)] for r in range(n)]
    out = [[[set(x) for x in row] for row in s]]
    for k in range(n - 1):                      # reduce-scatter: rank r sends chunk (r - k) to r + 1, which adds
        sent = [(r, (r - k) % n, set(s[r][(r - k) % n])) for r in range(n)]
        for r, c, v in sent:
            s[(r + 1) % n][c] |= v
    out.append([[set(x) for x in row] for row in s])
    for k in range(n - 1):                      # all-gather: rank r sends chunk (r + 1 - k) to r + 1, which overwrites
        sent = [(r, (r + 1 - k) % n, set(s[r][(r + 1 - k) % n])) for r in range(n)]
        for r, c, v in sent:
            s[(r + 1) % n][c] = v
    out.append([[set(x) for x in row] for row in s])
    return out


def draw():
    W, H = 780, 270
    f = Figure("ch08-ring-allreduce", "4 张卡上的 Ring AllReduce：规约-散射之后每张卡有一块完整的和，全收集之后每张卡都有全部",
               "每张卡把梯度切成 4 块，沿环每步发一块给右邻居。规约-散射 3 步后，每张卡恰好有一块是 4 张卡之和；"
               "全收集再走 3 步，每张卡都拿到完整的和。每张卡共发送 2(N−1)/N 份梯度，N = 4 时是 1.5 份。", W, H)
    cx, cy, rad = 92, 130, 52                   # the ring itself
    pos = [(cx + rad * math.sin(2 * math.pi * r / N), cy - rad * math.cos(2 * math.pi * r / N)) for r in range(N)]
    for r, (x, y) in enumerate(pos):
        nx, ny = pos[(r + 1) % N]
        dx, dy = nx - x, ny - y
        d = math.hypot(dx, dy)
        f.arrow(x + dx * 22 / d, y + dy * 22 / d, nx - dx * 22 / d, ny - dy * 22 / d)
        f.box(x - 20, y - 13, 40, 26, f"GPU{r}", "neutral", size=12)
    f.text(cx, 218, "每步：发一块给右邻居", size=12, color=MUTED)
    titles = ["开始：各卡的梯度", f"规约-散射 {N - 1} 步后", f"全收集 {N - 1} 步后"]
    cw, ch, gx, step = 36, 30, 250, 182
    for r in range(N):
        f.text(gx - 6, 70 + r * ch + 19, f"GPU{r}", anchor="end", size=12, color=MUTED)
    for p, (title, st) in enumerate(zip(titles, ring_states(N))):
        x0 = gx + p * step
        f.text(x0 + N * cw / 2, 40, title, bold=True)
        for c in range(N):
            f.text(x0 + c * cw + cw / 2, 62, f"块{c}", size=12, color=MUTED)
        for r in range(N):
            y = 70 + r * ch
            for c in range(N):
                k = len(st[r][c])
                f.rect(x0 + c * cw, y, cw - 3, ch - 3, "comm" if k == N else "free", rx=3)
                f.text(x0 + c * cw + (cw - 3) / 2, y + 19, f"{k}/{N}", size=12, bold=k == N)
        if p:
            f.arrow(x0 - 34, 128, x0 - 6, 128, color=EDGE)
    per_rank = 2 * (N - 1) / N
    f.text(gx, 215, "格中数字：这一块已经加进了几张卡的梯度（红色 = 全部）", anchor="start", size=12, color=MUTED)
    f.text(gx, 245, f"每张卡发送 = 2(N−1) 步 × S/N = {per_rank:g}·S（N = {N}）；N 再大也不超过 2S",
           anchor="start")
    return [f]
