"""Ch11: one small long-lived tensor pins a whole cached segment (the tutorial's 100 MiB + 4 MiB example).

A tiny model of the caching allocator's large pool (sizes in MiB, multiples of 512 bytes): new segment
sizes per the chapter's S(s') (1-10 MiB requests get 20 MiB, >= 10 MiB rounded to 2 MiB), best fit among
free blocks, split only when more than 1 MiB would remain, neighbours merge on free. The two orders are
replayed through it; the drawn segments and the allocated/reserved totals come out of the replay.
"""
import math

from diagrams.svg import MUTED, Figure


def segment_size(s):
    return 20 if 1 < s < 10 else 2 * math.ceil(s / 2)


def replay(events):
    segs = []                                          # each segment: list of [size, owner or None]
    for op, name, size in events:
        if op == "free":
            for seg in segs:
                for b in seg:
                    if b[1] == name:
                        b[1] = None
                for i in range(len(seg) - 1, 0, -1):   # merge free neighbours
                    if seg[i][1] is None and seg[i - 1][1] is None:
                        seg[i - 1][0] += seg.pop(i)[0]
            continue
        free = [(b[0], si, bi) for si, seg in enumerate(segs) for bi, b in enumerate(seg) if b[1] is None and b[0] >= size]
        if not free:
            segs.append([[segment_size(size), None]])
            free = [(segs[-1][0][0], len(segs) - 1, 0)]
        _, si, bi = min(free)                          # best fit
        block = segs[si][bi]
        if block[0] - size > 1:                        # should_split() for the large pool
            segs[si].insert(bi + 1, [block[0] - size, None])
            block[0] = size
        block[1] = name
    return segs


ORDERS = [
    ("先用临时张量，再建长寿张量", [("alloc", "临时", 100), ("free", "临时", 0), ("alloc", "长寿", 4), ("alloc", "临时2", 100)]),
    ("先建长寿张量", [("alloc", "长寿", 4), ("alloc", "临时", 100), ("free", "临时", 0), ("alloc", "临时2", 100)]),
]


def text_width(s, size=12):
    return sum(size if ord(c) > 0x2e80 else 0.55 * size for c in s)


def draw():
    W, x0, px = 780, 24, 3.5
    f = Figure("ch11-pinned-segment", "缓存分配器的段与块：一个 4 MiB 的长寿张量钉住了 100 MiB 的段",
               "上一行先用后释放 100 MiB 的临时张量，4 MiB 的长寿张量被最佳适配切进这个空闲块，剩下 96 MiB 空着却还不回去，"
               "下一个 100 MiB 请求只好再要一段：已分配 104 MiB，已保留 200 MiB。下一行先建长寿张量，它落进自己的 20 MiB 段，已保留 120 MiB。",
               W, 306)
    for k, (title, events) in enumerate(ORDERS):
        y = 30 + k * 134
        segs = replay(events)
        reserved = sum(b[0] for seg in segs for b in seg)
        allocated = sum(b[0] for seg in segs for b in seg if b[1])
        steps = " → ".join(("释放" if op == "free" else "") + f"{n}" + (f" {s} MiB" if s else "") for op, n, s in events)
        f.text(x0, y, f"{title}：{steps}", anchor="start", bold=True)
        x = x0
        for seg in segs:
            w = sum(b[0] for b in seg) * px
            f.rect(x - 3, y + 12, w + 6, 52, "idle", rx=5)
            bx = x
            for size, owner in seg:
                role = "free" if owner is None else ("param" if owner == "长寿" else "temp")
                f.rect(bx, y + 18, size * px, 40, role, rx=2, dash=owner is None and len(seg) > 1)
                name = owner or ("切开的空闲" if len(seg) > 1 else "空闲")
                for label in (f"{name} {size} MiB", f"{size} MiB"):
                    if text_width(label) + 8 < size * px:
                        f.text(bx + size * px / 2, y + 43, label, size=12)
                        break
                bx += size * px
            f.text(x + w / 2, y + 78, f"段 {sum(b[0] for b in seg)} MiB", size=12, color=MUTED)
            x += w + 18
        pinned = sum(b[0] for seg in segs if any(b[1] for b in seg) for b in seg if b[1] is None)
        f.text(x0, y + 100, f"结果：已分配 {allocated} MiB，已保留 {reserved} MiB，"
               f"其中 {pinned} MiB 是切开后还不回去的空闲（inactive_split）", anchor="start")
    f.legend(x0, 292, [("param", "长寿张量"), ("temp", "临时张量"), ("free", "空闲块（虚线：与活着的块同段，还不回去）")])
    return [f]
