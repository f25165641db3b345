"""The trace JSON format, built from a list of allocation events and downsampled for the browser.

    {"format": "vramlab-trace", "version": 1, "title", "description", "source": {...},
     "x_label": "分配/释放事件序号", "categories": [...], "category_zh": {...},
     "peak": {"bytes", "reserved", "x", "op", "module", "breakdown": {category: bytes}},
     "marks": [{"x", "label"}],                     # step and phase boundaries
     "points": {"x": [...], "allocated": [...], "reserved": [...] or null,
                "by_category": {category: [...]}, "label": [index into "labels"]},
     "labels": ["op @ module", ...]}

All sizes are bytes. The peak is taken from every event, before downsampling, so it is exact.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import vocab

FORMAT, VERSION = "vramlab-trace", 1
MAX_POINTS = 1200

CATEGORY_ZH = vocab.labels()


@dataclass
class Event:
    """One allocation (delta > 0) or free (delta < 0) of `category`; `reserved` after it (or None)."""
    delta: int
    category: str
    op: str
    module: str
    reserved: int | None = None


def build_trace(events: list[Event], *, title: str, description: str, source: dict,
                marks: list[tuple[int, str]] = (), initial: dict[str, int] | None = None,
                x_label: str = "分配/释放事件序号", max_points: int = MAX_POINTS) -> dict:
    """Replay `events` into per-category series, find the peak, keep at most `max_points` points."""
    sums = dict(initial or {})
    cats = list(dict.fromkeys([*sums, *(e.category for e in events)]))
    order = [c for c in CATEGORY_ZH if c in cats] + [c for c in cats if c not in CATEGORY_ZH]
    labels: dict[str, int] = {}
    rows = []               # (allocated, reserved, {cat: bytes}, label index)
    peak_i, peak_bytes = 0, -1
    for i, e in enumerate(events):
        sums[e.category] = sums.get(e.category, 0) + e.delta
        allocated = sum(sums.values())
        text = f"{'' if e.delta > 0 else 'free '}{e.op} @ {e.module}"
        rows.append((allocated, e.reserved, dict(sums), labels.setdefault(text, len(labels))))
        if allocated > peak_bytes:
            peak_i, peak_bytes = i, allocated
    keep = _downsample([r[0] for r in rows], max_points, must={peak_i, *(x for x, _ in marks)})
    peak_event = events[peak_i] if events else Event(0, "other", "-", "-")
    has_reserved = any(r[1] is not None for r in rows)
    used = sorted({rows[i][3] for i in keep})
    remap = {old: new for new, old in enumerate(used)}
    names = list(labels)
    return {
        "format": FORMAT, "version": VERSION, "title": title, "description": description, "source": source,
        "x_label": x_label, "categories": order, "category_zh": {c: CATEGORY_ZH.get(c, c) for c in order},
        "peak": {"bytes": peak_bytes if rows else 0, "reserved": rows[peak_i][1] if rows else None, "x": peak_i,
                 "op": peak_event.op, "module": peak_event.module,
                 "breakdown": {c: rows[peak_i][2].get(c, 0) for c in order} if rows else {}},
        "marks": [{"x": x, "label": label} for x, label in marks],
        "points": {"x": keep, "allocated": [rows[i][0] for i in keep],
                   "reserved": [rows[i][1] for i in keep] if has_reserved else None,
                   "by_category": {c: [rows[i][2].get(c, 0) for i in keep] for c in order},
                   "label": [remap[rows[i][3]] for i in keep]},
        "labels": [names[i] for i in used],
    }


def _downsample(values: list[int], max_points: int, must: set[int]) -> list[int]:
    """Indices to keep: the first, the last, `must`, and per bucket the lowest and highest point,
    so the shape (every spike and dip) survives."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    keep = {0, n - 1, *(i for i in must if 0 <= i < n)}
    buckets = max(1, (max_points - len(keep)) // 2)
    size = n / buckets
    for b in range(buckets):
        lo, hi = int(b * size), min(n, int((b + 1) * size))
        if lo >= hi:
            continue
        chunk = range(lo, hi)
        keep.add(max(chunk, key=values.__getitem__))
        keep.add(min(chunk, key=values.__getitem__))
    return sorted(keep)


def check_trace(t: dict) -> None:
    """Raise ValueError (Chinese) if `t` is not a trace the viewer can show."""
    if t.get("format") != FORMAT or t.get("version") != VERSION:
        raise ValueError(f"不是 vramlab 时间线文件（format 应为 {FORMAT!r}、version 为 {VERSION}）")
    pts = t["points"]
    n = len(pts["x"])
    for c in t["categories"]:
        if len(pts["by_category"][c]) != n:
            raise ValueError(f"类别 {c} 的点数与 x 不一致")
    for i in range(n):
        if sum(pts["by_category"][c][i] for c in t["categories"]) != pts["allocated"][i]:
            raise ValueError(f"第 {i} 个点：各类别之和不等于 allocated")
