"""Feedback that teaches: where the memory went, the hint that fits what went wrong, and what a
hidden case's failure means, without its hidden values.

Parent side. The figures come from the grading children's `memory` field (vramlab.grader.memtrace):
the trusted starter's run gives the starter's, the learner's run the learner's. The learner's is a
claim, so its shape is checked here and a malformed one is dropped: it is feedback, never part of
a verdict (the kinds judge from the payload's own fields and the parent's observations).

    memory_view(spec, scale, bp, sp)  -> result["memory"]: both runs, x in steps
    normalised(view)                  -> the same shapes in units of the starter's peak (hidden cases)
    memory_lines(view)                -> Chinese lines: breakdown at each peak, top tensors, per-step growth
    figure_svg(view)                  -> a small SVG: allocated over the steps, starter vs yours
    choose_hint(result)               -> (index, why): the spec's hint for what went wrong
    hidden_failure_reason(...)        -> a hidden case's message: what changed, what failed, where
    explain(result)                   -> an OOM's reason in Chinese, with its step, operator and line
"""
from __future__ import annotations

import bisect
import html
import math
import re

from .. import vocab
from ..display import width
from .kinds import traits
from ..units import fmt_bytes
from .kinds.common import INT, STR, dict_of, list_of, optional, pair, record

# ---- the child's claim, checked before anything reads it -------------------------------------------


def _ints(n: int):
    """A list of exactly n non-negative integers."""
    def check(value, path: str):
        if type(value) is not list or len(value) != n:
            return f"{path} 应当是 {n} 个整数"
        for i, x in enumerate(value):
            why = INT(x, f"{path}[{i}]")
            if why:
                return why
        return None
    return check


TOP = record(bytes=INT, op=STR, where=STR, category=STR)
OOM = record(call=INT, optimizer_steps=INT, op=STR, module=STR, phase=STR, line=INT, function=STR, request=INT,
             allocated=INT, capacity=INT, breakdown=dict_of(INT, 16), top=list_of(TOP, 8), code=STR, x=INT)
MEMORY = record(events=INT, points=list_of(pair(INT, INT), 400), calls=list_of(_ints(9), 64),
                steps=list_of(pair(INT, INT), 200), ooms=list_of(pair(INT, INT), 32), peak=INT,
                peak_call=optional(INT), peak_label=STR, breakdown=dict_of(INT, 16), top=list_of(TOP, 8),
                capacity=INT, oom=optional(OOM))


def claim(payload) -> dict | None:
    """The payload's `memory` field when it has the shape memtrace writes, else None."""
    mem = payload.get("memory") if isinstance(payload, dict) else None
    if not isinstance(mem, dict) or MEMORY(mem, "memory") is not None or not mem["calls"]:
        return None
    calls = mem["calls"]
    if any(c[1] < c[0] for c in calls) or any(b[0] < a[1] for a, b in zip(calls, calls[1:])):
        return None
    if mem["peak_call"] is not None and mem["peak_call"] >= len(calls):
        return None
    return mem


# ---- one run on a common x axis: call k spans [k, k + 1) ---------------------------------------------


def _axis(calls: list):
    starts = [c[0] for c in calls]

    def fx(x: int) -> float:
        i = max(0, bisect.bisect_right(starts, x) - 1)
        s, e = calls[i][0], calls[i][1]
        return round(i + (min(max(x, s), e) - s) / (e - s), 4) if e > s else float(i)
    return fx


def run_view(mem: dict) -> dict:
    calls = mem["calls"]
    fx = _axis(calls)
    finished = [c for c in calls if c[6]]
    view = {
        "series": [[fx(x), y] for x, y in mem["points"]],
        "calls": len(calls),
        "step_ends": [c[3] for c in finished],
        # what each finished call left behind that is not model state (0 for steady training)
        "carried": [c[8] for c in finished],
        "optimizer_steps": [[fx(x), a] for x, a in mem["steps"]],
        "ooms": [[fx(x), a] for x, a in mem["ooms"]],
        "breakdown": dict(mem["breakdown"]), "top": [dict(t) for t in mem["top"]],
        "peak_label": mem["peak_label"], "capacity": mem["capacity"] or None,
        "peak": None, "oom": None,
    }
    pc = mem["peak_call"]
    if pc is not None:
        view["peak"] = {"x": fx(calls[pc][5]), "bytes": mem["peak"], "call": pc + 1}
    if mem["oom"] is not None:
        oom = dict(mem["oom"])
        oom["x"] = fx(oom["x"])
        view["oom"] = oom
    return view


def memory_view(spec, scale: str, bp, sp) -> dict | None:
    """Both runs of one case for the report (None where neither run recorded anything)."""
    kind = traits(spec.kind)
    if not kind.memory_view:         # the answer is a number, not a run to look at
        return None
    starter, mine = claim(bp), claim(sp)
    if starter is None and mine is None:
        return None
    sc = getattr(spec, scale)
    card = any(getattr(sc.settings, k, None) for k in ("learner_budget_mib", "budget_mib"))
    return {"kind": spec.kind, "warmup": int(sc.warmup) if kind.training_steps else 0,
            "card": bool(card), "unit": "bytes", "starter": run_view(starter) if starter else None, "mine": run_view(mine) if mine else None}


def normalised(view: dict | None) -> dict | None:
    """`view` with every byte count divided by the starter's peak (the hidden case's shapes without its
    values). Without a starter run there is no yardstick: None."""
    if not view or not view.get("starter") or not (view["starter"].get("peak") or {}).get("bytes"):
        return None
    unit = view["starter"]["peak"]["bytes"]

    def r(b):
        return None if b is None else round(b / unit, 4)

    def run(v):
        if v is None:
            return None
        out = dict(v, series=[[x, r(y)] for x, y in v["series"]], step_ends=[r(b) for b in v["step_ends"]],
                   carried=[r(b) for b in v["carried"]], optimizer_steps=[[x, r(a)] for x, a in v["optimizer_steps"]],
                   ooms=[[x, r(a)] for x, a in v["ooms"]], breakdown={k: r(b) for k, b in v["breakdown"].items()},
                   top=[dict(t, bytes=r(t["bytes"])) for t in v["top"]], capacity=r(v["capacity"]))
        if v.get("peak"):
            out["peak"] = dict(v["peak"], bytes=r(v["peak"]["bytes"]))
        if v.get("oom"):
            o = v["oom"]
            out["oom"] = dict(o, request=r(o["request"]), allocated=r(o["allocated"]), capacity=r(o["capacity"]),
                              breakdown={k: r(b) for k, b in o["breakdown"].items()},
                              top=[dict(t, bytes=r(t["bytes"])) for t in o["top"]])
        return out
    starter, mine = run(view["starter"]), run(view["mine"])
    if mine and starter and mine["calls"] < starter["calls"]:
        starter = _cut(starter, mine["calls"])       # the hidden case's number of steps is not shown either
    return dict(view, unit="starter_peak", starter=starter, mine=mine)


def _cut(run: dict, calls: int) -> dict:
    """`run` up to the end of its call `calls` (the x axis's first `calls` steps)."""
    out = dict(run, calls=calls, series=[p for p in run["series"] if p[0] <= calls], step_ends=run["step_ends"][:calls],
               carried=run["carried"][:calls], optimizer_steps=[p for p in run["optimizer_steps"] if p[0] <= calls],
               ooms=[p for p in run["ooms"] if p[0] <= calls])
    if run.get("peak") and run["peak"]["x"] > calls:
        out["peak"] = None
    return out


# ---- words ---------------------------------------------------------------------------------------
CATEGORY_ZH = vocab.labels(("parameters", "gradients", "optimizer_state", "activations", "temporaries",
                            "cuda_overhead", "other"))
CATEGORY_NOTE = {k: vocab.note(k) for k in ("temporaries", "other")}     # said where your run has more of it


def pad(s: str, n: int, right: bool = False) -> str:
    """`s` in `n` terminal columns (display.width: CJK characters take two), left- or right-aligned."""
    fill = " " * max(0, n - width(s))
    return fill + s if right else s + fill


def amount(b, unit: str) -> str:
    """Bytes, or (hidden cases) a share of the starter's peak."""
    if b is None:
        return "-"
    return fmt_bytes(b) if unit == "bytes" else f"{b * 100:.0f}%"


def place_zh(where: str) -> str:
    """The tracker's location of an allocation, in words."""
    if not where or where == "-":
        return "你的函数里（模型的模块之外）"
    if where.startswith("recompute:"):
        return f"反向时重算的{place_zh(where.split(':', 1)[1])}"
    if where.startswith("backward:"):
        return f"反向（{where.split(':', 1)[1]}）"
    if where == "optimizer.step":
        return "优化器 step"
    if "." not in where and where[:1].isupper():
        return f"模型 {where}（最外层）"
    return f"模块 {where}"


def op_zh(op: str, category: str = "") -> str:
    if category == "cuda_overhead" or op == "register":
        return "cuBLAS 工作区" if category == "cuda_overhead" else "登记的张量"
    return re.sub(r"\.default$", "", op)


def call_zh(kind: str, k: int) -> str:
    """The learner's k-th call (1-based), as the exercise calls it (the kind's Traits)."""
    return traits(kind).call_name(k)


def oom_where_zh(kind: str, oom: dict) -> str:
    """Which step overflowed: a call of train_step, or an optimizer step inside one call."""
    return traits(kind).oom_where(oom)


def _oom_detail(view: dict, oom: dict, unit: str) -> str:
    """Operator, module, phase and the learner's line of an overflow."""
    phase = {"forward": "前向", "backward": "反向", "optimizer": "优化器 step"}.get(oom["phase"], "")
    parts = [f"算子 {op_zh(oom['op']) or '（未知）'}", place_zh(oom["module"])]
    if phase and not oom["module"].startswith("backward:"):
        parts.append(f"{phase}阶段")
    text = "，".join(parts)
    if oom["line"] and oom.get("code"):
        # the line itself, not its number: a notebook's check grades a module built from its cells,
        # whose numbers are not the cell's
        inside = f"（{oom['function']} 里）" if oom["function"] else ""
        text += f"；出错的是你的代码{inside}这一行：`{oom['code']}`"
    return text


def oom_sentence(view: dict, kind: str) -> str | None:
    """'第 2 步显存溢出：…' from the learner run's recorded overflow (None when there is none)."""
    mine = (view or {}).get("mine") or {}
    oom = mine.get("oom")
    if not oom:
        return None
    unit = view.get("unit", "bytes")
    where = oom_where_zh(kind, oom)
    done = len(mine.get("step_ends") or [])
    before = f"（前面 {done} 步都放得下）" if traits(kind).training_steps and done else ""
    if unit == "bytes":
        cap = oom["capacity"]
        free = max(cap - oom["allocated"], 0) if cap else None
        size = (f"要再申请 {fmt_bytes(oom['request'])} 时，{fmt_bytes(cap)} 的显卡上已经分配了 {fmt_bytes(oom['allocated'])}"
                + (f"（只剩 {fmt_bytes(free)}）" if free is not None else "")) if cap else \
            f"要再申请 {fmt_bytes(oom['request'])} 时显存不够了"
    else:
        cap = oom["capacity"]
        size = (f"要再申请相当于这张卡 {oom['request'] / cap * 100:.1f}% 的显存时，已分配的显存已经占了这张卡的 "
                f"{oom['allocated'] / cap * 100:.0f}%") if cap else "显存不够了"
    return f"{where}显存溢出{before}：{size}。位置：{_oom_detail(view, oom, unit)}"


# ---- growth from step to step -----------------------------------------------------------------------


def growth(run: dict | None, unit: str) -> dict | None:
    """What the run handed from one call to the next: {"per_step": typical growth, "carried": last,
    "leaks": whether it grew}. Based on the bytes left alive by learner calls that are not model state."""
    if not run:
        return None
    carried = run.get("carried") or []
    if not carried:
        return None
    peak = (run.get("peak") or {}).get("bytes") or max((y for _, y in run["series"]), default=0) or 1
    threshold = max(2 ** 18 if unit == "bytes" else 0.0, 0.005 * peak)
    steps = [b - a for a, b in zip([0, *carried], carried)]
    grew = [d for d in steps if d > threshold]
    # one step that left something behind and then an overflow: the step-to-step growth the card could not hold
    leaks = len(grew) >= max(1, len(steps) - 1) and (len(steps) >= 2 or bool(run.get("oom")))
    return {"per_step": sorted(steps)[len(steps) // 2] if steps else 0, "carried": carried[-1], "leaks": leaks,
            "steps": steps}


def leak_class(view: dict | None) -> str | None:
    """"leak" when the learner's run grows from step to step, "leak_partial" when it grows less than
    the starter's (one leak fixed, another left), None when it does not grow."""
    if not view:
        return None
    unit = view.get("unit", "bytes")
    mine, base = growth(view.get("mine"), unit), growth(view.get("starter"), unit)
    if not mine or not mine["leaks"]:
        return None
    if base and base["leaks"] and base["per_step"] > 0 and mine["per_step"] < 0.9 * base["per_step"]:
        return "leak_partial"
    return "leak"


def _chain(values: list, unit: str, limit: int = 6) -> str:
    shown = values if len(values) <= limit else [*values[:limit - 2], None, values[-1]]
    return " → ".join("…" if v is None else amount(v, unit) for v in shown)


def step_lines(view: dict) -> list[str]:
    """Allocated after each step, and what each step left behind (the leak exercises' evidence)."""
    unit, kind = view.get("unit", "bytes"), view.get("kind", "")
    lines = []
    runs = [(name, view.get(key)) for name, key in (("起始代码", "starter"), ("你的", "mine"))]
    multi = [(n, r) for n, r in runs if r and (len(r["step_ends"]) >= 2 or r.get("oom"))]
    if not multi or not traits(kind).per_step_lines:
        return lines
    # the leak and OOM exercises (a card), or any run that grew or overflowed: elsewhere a flat line says nothing
    if not view.get("card") and not any(r.get("oom") or (growth(r, unit) or {}).get("leaks") for _, r in multi):
        return lines
    lines.append("  每步结束时的已分配显存" + ("（占起始代码峰值的比例）" if unit != "bytes" else "") + "：")
    for name, r in multi:
        g = growth(r, unit)
        tail = ""
        if r.get("oom"):
            tail = f" → {oom_where_zh(kind, r['oom'])} OOM"
        trend = ""
        if g and g["leaks"]:
            trend = f"（每步多留下约 {amount(g['per_step'], unit)}：在涨）" if len(g["steps"]) >= 2 else \
                f"（第 1 步结束后有 {amount(g['carried'], unit)} 不属于参数、梯度和优化器状态的显存没有释放）"
        elif g and len(r["step_ends"]) >= 2:
            trend = "（平稳）"
        ends = _chain(r["step_ends"], unit) if r["step_ends"] else "（没有一步完成）"
        lines.append(f"    {pad(name, 10)}{ends}{tail}{trend}")
    return lines


# ---- the report's memory section -------------------------------------------------------------------


def memory_lines(view: dict | None, top_n: int = 8) -> list[str]:
    """Breakdown by category at each run's peak (or, for an overflow, at the moment it overflowed),
    the largest live tensors of the learner's run there, and the per-step growth."""
    if not view:
        return []
    if traits(view.get("kind")).timeline_only:      # ch13: the peak includes the grader's re-check
        return []
    unit = view.get("unit", "bytes")
    base, mine = view.get("starter"), view.get("mine")
    mine_at_oom = bool(mine and mine.get("oom"))
    mine_bd = (mine["oom"]["breakdown"] if mine_at_oom else mine["breakdown"]) if mine else {}
    base_bd = base["breakdown"] if base else {}
    lines = ["  显存花在了哪里" + ("（占起始代码峰值的比例；隐藏配置不显示具体数值）" if unit != "bytes" else "") + "："]
    head_mine = "你的（溢出那一刻）" if mine_at_oom else "你的峰值"

    label_w = max(width(zh) for zh in CATEGORY_ZH.values()) + 2

    def row(a: str, b: str, c: str, note: str = "") -> str:
        return f"    {pad(a, label_w)}{pad(b, 14, True)}{pad(c, 20, True)}{note}"
    lines.append(row("类别", "起始代码峰值", head_mine))
    total_b = (base["peak"]["bytes"] if base.get("peak") else sum(base["breakdown"].values())) if base else None
    total_m = (mine["oom"]["allocated"] if mine_at_oom else (mine.get("peak") or {}).get("bytes")) if mine else None
    floor = 0.005 * max(total_b or 0, total_m or 0)      # a category under 0.5% of the peaks is left out
    for k, zh in CATEGORY_ZH.items():
        b, m = base_bd.get(k), mine_bd.get(k)
        if (b or 0) <= floor and (m or 0) <= floor:
            continue
        more = (m or 0) - (b or 0)
        notable = more > (2 ** 20 if unit == "bytes" else 0.01) and more > 0.05 * (b or 0)
        note = f"  （{CATEGORY_NOTE[k]}）" if k in CATEGORY_NOTE and notable else ""
        lines.append(row(zh, amount(b or 0, unit) if base else "-", amount(m or 0, unit) if mine else "-", note))
    lines.append(row("合计", amount(total_b, unit), amount(total_m, unit)))
    kind = view.get("kind", "")
    for name, r in (("起始代码的", base), ("你的", mine)):
        if r and r.get("peak") and not (r is mine and mine_at_oom):
            label = r.get("peak_label") or ""
            where = ""
            if " @ " in label:
                op, loc = label.split(" @ ", 1)
                where = f"：{op_zh(op)}，{place_zh(loc)}"
            calls = r.get("calls", 1)
            whole = "这个 epoch 里" if traits(kind).epoch else "这次调用"
            at = call_zh(kind, r["peak"]["call"]) if calls > 1 else whole
            lines.append(f"  {name}峰值出现在{at}{where}")
    tops = (mine["oom"]["top"] if mine_at_oom else mine["top"]) if mine else []
    if tops and top_n:
        lines.append(f"  {'溢出' if mine_at_oom else '你的峰值'}那一刻还活着的最大的张量（前 {min(top_n, len(tops))} 个，"
                     "按创建它的算子和模块合并）：")
        groups: dict[tuple, list] = {}
        for t in tops[:top_n]:
            groups.setdefault((t["category"], t["op"], t["where"]), []).append(t["bytes"])
        for (category, op, where), sizes in groups.items():
            size = amount(sizes[0], unit) if len(set(sizes)) == 1 else f"{amount(min(sizes), unit)}–{amount(max(sizes), unit)}"
            count = f" × {len(sizes)}" if len(sizes) > 1 else ""
            cat = CATEGORY_ZH.get(category, category).split("（")[0]      # the op beside it says the rest
            lines.append(f"    {pad(size + count, 16, True)}  {pad(cat, 10)}{op_zh(op, category)}，{place_zh(where)}")
    lines += step_lines(view)
    return lines


# ---- the figure -----------------------------------------------------------------------------------
W, H = 680, 300
ML, MR, MT, MB = 72, 24, 34, 52
FONT = "'Noto Sans CJK SC','Source Han Sans SC','PingFang SC','Microsoft YaHei',sans-serif"
COLOURS = {"starter": "#868e96", "mine": "#1c7ed6"}


def _nice(top: float) -> float:
    """A round step for about 4 grid lines up to `top`."""
    raw = top / 4 or 1
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def figure_svg(view: dict | None, title: str = "") -> str | None:
    """Allocated memory over the learner's calls (steps), the starter's and yours on one axis: step
    boundaries, warm-up shaded, each step's end dotted, both peaks marked, your card and an overflow.
    Hidden cases (unit "starter_peak") are drawn in shares of the starter's peak."""
    if not view:
        return None
    runs = [(k, view.get(k)) for k in ("starter", "mine") if view.get(k) and view[k]["series"]]
    if not runs:
        return None
    unit, kind = view.get("unit", "bytes"), view.get("kind", "")
    scale = 2 ** 20 if unit == "bytes" else 0.01       # MiB, or percent of the starter's peak
    suffix = " MiB" if unit == "bytes" else "%"
    n = max(r["calls"] for _, r in runs)
    ys = [y for _, r in runs for _, y in r["series"]]
    cap = (view.get("mine") or {}).get("capacity")
    top = max([*ys, cap or 0]) / scale * 1.1 or 1
    step = _nice(top)
    top = math.ceil(top / step) * step
    pw, ph = W - ML - MR, H - MT - MB

    def X(x):
        return ML + pw * x / n

    def Y(b):
        return MT + ph * (1 - (b / scale) / top)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'font-family="{FONT}" font-size="12" role="img">',
           f'<title>{html.escape(title or "显存时间线")}</title>',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>']
    warm = min(view.get("warmup") or 0, n)
    if warm:
        out.append(f'<rect x="{X(0):.1f}" y="{MT}" width="{X(warm) - X(0):.1f}" height="{ph}" fill="#f1f3f5"/>')
    for i in range(int(top / step) + 1):       # horizontal grid and y labels
        v = i * step
        y = MT + ph * (1 - v / top)
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e9ecef"/>')
        out.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#495057">{v:g}{suffix}</text>')
    for k in range(n + 1):                      # step boundaries
        out.append(f'<line x1="{X(k):.1f}" x2="{X(k):.1f}" y1="{MT}" y2="{MT + ph}" stroke="#ced4da" stroke-dasharray="3,3"/>')
    if n <= 12 or traits(kind).training_steps:
        for k in range(n):
            label = call_zh(kind, k + 1) + ("（预热）" if k < warm else "")
            out.append(f'<text x="{(X(k) + X(k + 1)) / 2:.1f}" y="{MT + ph + 18}" text-anchor="middle" fill="#495057">'
                       f'{html.escape(label)}</text>')
    if traits(kind).epoch:
        for name, r in runs:
            for x, _ in r["optimizer_steps"][:60]:
                out.append(f'<line x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{MT + ph}" y2="{MT + ph + 5}" stroke="{COLOURS[name]}"/>')
    axis = "已分配显存" if unit == "bytes" else "已分配显存（起始代码峰值 = 100%）"
    out.append(f'<text x="14" y="{MT + ph / 2:.1f}" transform="rotate(-90 14 {MT + ph / 2:.1f})" text-anchor="middle" '
               f'fill="#495057">{axis}</text>')
    if cap:
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{Y(cap):.1f}" y2="{Y(cap):.1f}" stroke="#e03131" stroke-dasharray="6,4"/>')
        out.append(f'<text x="{ML + 4}" y="{Y(cap) - 5:.1f}" fill="#e03131">你的显卡 {amount(cap, unit)}</text>')
    for name, r in runs:                        # the two lines
        pts = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in r["series"])
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLOURS[name]}" stroke-width="1.6" '
                   f'stroke-linejoin="round"/>')
    for name, r in runs:                        # each finished call's end
        finished = len(r["step_ends"])
        for k, b in enumerate(r["step_ends"][:64]):
            # finished calls are the first ones, except when one failed midway (then it is the last)
            out.append(f'<circle cx="{X(k + 1):.1f}" cy="{Y(b):.1f}" r="3" fill="{COLOURS[name]}"/>')
        del finished
    labels = []
    for name, r in runs:                        # peaks
        p = r.get("peak") if not traits(kind).timeline_only else None
        if p and not (name == "mine" and r.get("oom")):
            who = "起始代码峰值" if name == "starter" else "你的峰值"
            labels.append((X(p["x"]), Y(p["bytes"]), f"{who} {amount(p['bytes'], unit)}", COLOURS[name]))
            out.append(f'<path d="M{X(p["x"]):.1f},{Y(p["bytes"]) - 2:.1f} l-5,-8 h10 z" fill="{COLOURS[name]}"/>')
    mine = view.get("mine")
    if mine:
        for x, a in mine["ooms"][:32]:
            cx, cy = X(x), Y(a)
            out.append(f'<path d="M{cx - 5:.1f},{cy - 5:.1f} l10,10 m0,-10 l-10,10" stroke="#e03131" stroke-width="2.2"/>')
        if mine.get("oom"):
            o = mine["oom"]
            labels.append((X(o["x"]), Y(o["allocated"]), f"OOM（{oom_where_zh(kind, o)}）", "#e03131"))
    placed: list[float] = []
    for x, y, text, colour in sorted(labels, key=lambda t: t[1]):     # labels above their marks, not on each other
        ty = max(MT + 10, y - 12)
        while any(abs(ty - p) < 14 for p in placed):
            ty += 14
        placed.append(ty)
        # yours and an overflow to the left of their mark, the starter's to the right, unless off the plot
        anchor = "end" if colour != COLOURS["starter"] else "start"
        if anchor == "end" and x - ML < 8 * width(text):
            anchor = "start"
        elif anchor == "start" and W - MR - x < 8 * width(text):
            anchor = "end"
        tx = x - 6 if anchor == "end" else x + 6
        out.append(f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" fill="{colour}" font-weight="600" '
                   f'stroke="#fff" stroke-width="3" paint-order="stroke">{html.escape(text)}</text>')
    lx = ML + 8                                 # legend
    for i, (name, r) in enumerate(runs):
        y = H - 12
        x = lx + i * 150
        out.append(f'<line x1="{x}" x2="{x + 22}" y1="{y - 4}" y2="{y - 4}" stroke="{COLOURS[name]}" stroke-width="2.4"/>')
        out.append(f'<text x="{x + 28}" y="{y}" fill="#212529">{"起始代码" if name == "starter" else "你的代码"}</text>')
    out.append(f'<text x="{ML + 310}" y="{H - 12}" fill="#868e96">● 每步结束  ▼ 峰值  ✕ OOM</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---- the hint that fits what went wrong --------------------------------------------------------------
# Which hints speak to which failure, by what they talk about. Specs write their hints from a question
# (first) to the answer (last); the report never picks the last one for the learner (it gives the way
# away: the notebook unfolds it on request).
HINT_TOPICS = {
    "incorrect": r"加权|缩放|平均|求和|相同|一致|同样的|随机数|dropout|推理模式|超参数|绝对位置",
    "leak": r"涨|增长|每步结束|引用|计算图|还活着|泄漏",
    "leak_partial": r"不止一处|修好|再量一次|不再增长",
    "technique": r"现成的|工具|上下文管理器|一部分样本|几次前向|不必",
    "technique_partial": r"不够|只包住|少数|不超过",
    "hidden": r"层数|形状|写死|下标|按名字|最后一部分|比别的小|不一定|自己填|别按层号|绝对位置",
    "trials": r"试探|翻倍|二分|复查",
}
# A class a spec's hints do not speak to gets the closest one:
#   over_target, oom  -> the first hint (the question about what is alive at the peak) while the
#                        learner has saved next to nothing (ratio >= 0.95); the second (nearer the
#                        way) once part of the way is done. An OOM is an over-target run on a card.
#   leak_partial      -> "leak" (and that -> the first hint, which asks whether memory grows per step)
#   technique         -> the second hint: the first asks where the peak is, which the technique
#                        check has already answered ("you did not do X")
#   incorrect         -> the first hint: it states what must stay the same
#   error             -> the first hint: hints are about memory, a crash is about code; the first
#                        one orients without giving anything away (the report shows the error itself)
#   trials, slow      -> the first hint
CLOSEST = {"leak_partial": "leak", "technique_partial": "technique"}
CLASS_ZH = {"over_target": "峰值超出目标", "oom": "显存溢出", "leak": "显存每步都在涨",
            "leak_partial": "还有一处泄漏（比起始代码涨得慢，但仍在涨）", "incorrect": "结果与起始代码不一致",
            "technique": "没有观察到本题要求的方法", "technique_partial": "用了本题的方法，但用得不够",
            "error": "代码出错", "trials": "试探次数太多", "slow": "太慢"}
_CATEGORY_CLASS = {"incorrect": "incorrect", "technique": "technique", "exception": "error", "crashed": "error",
                   "timeout": "error", "exit": "error", "too_many_trials": "trials", "slow": "slow"}


def failure_class(result: dict) -> str | None:
    """What went wrong, as one of CLASS_ZH's keys (None: nothing a hint can help with, e.g. tampering)."""
    cat = result.get("category")
    view = result.get("hidden_memory") if result.get("hidden_failed") else result.get("memory")
    if cat in ("too_much_memory", "oom"):
        return leak_class(view) or ("oom" if cat == "oom" else "over_target")
    if cat == "technique" and re.search(r"检测到了|观察到了|只有|仍有", str(result.get("reason") or "")):
        return "technique_partial"       # the technique was seen, not enough of it (kinds/technique.py's words)
    return _CATEGORY_CLASS.get(cat)


def _topic_hint(hints: list[str], topic: str | None) -> int | None:
    """The earliest hint (never the last) that speaks most to `topic`."""
    if not topic or topic not in HINT_TOPICS:
        return None
    pattern = HINT_TOPICS[topic]
    scores = [len(set(re.findall(pattern, h))) for h in hints[:-1]]
    best = max(scores, default=0)
    return scores.index(best) if best else None


def choose_hint(result: dict) -> tuple[int, str] | None:
    """(index into result["hints"], the class in Chinese) for a failed result, or None."""
    hints = list(result.get("hints") or [])
    if result.get("passed") or not hints:
        return None
    cls = failure_class(result)
    if cls is None:
        return None
    last = max(0, len(hints) - 2)                 # never the answer itself when there is anything else
    hidden = bool(result.get("hidden_failed"))
    i = None
    if hidden and cls in ("over_target", "oom", "incorrect", "error"):
        i = _topic_hint(hints, "hidden")
    if i is None:
        i = _topic_hint(hints, cls) if cls in HINT_TOPICS else None
    if i is None and cls in CLOSEST:
        i = _topic_hint(hints, CLOSEST[cls])
    if i is None:
        if cls in ("technique", "technique_partial"):
            i = 1
        elif cls == "over_target" and result.get("ratio") is not None and result["ratio"] < 0.95:
            i = 1
        else:
            i = 0
    return min(i, last), CLASS_ZH[cls]


# ---- a hidden case's message ---------------------------------------------------------------------------


def _mask(text: str) -> str:
    """An exception's words without numbers that could be the hidden shapes."""
    text = re.sub(r"\d+(\.\d+)?\s*[KMG]i?B\b", "若干字节", text)
    return re.sub(r"\d{2,}", "N", text)


def hidden_failure_reason(case: dict, changes_zh: str, i: int, n: int) -> str:
    """Why the hidden case `i` of `n` failed, with which dimensions changed and the failure's kind,
    size (as a ratio) and place, never its values; ending with the question that fits the cause."""
    cat = case.get("category")
    view = case.get("memory")
    kind = (view or {}).get("kind", "")
    head = f"你看到的配置通过了，但评分时另加的隐藏配置 {i}/{n} 没有通过（与你看到的配置相比，{changes_zh}变了；具体数值不公开）："
    leak = leak_class(view)
    if cat == "oom" and oom_sentence(normalised(view) or {}, kind):
        what = oom_sentence(normalised(view), kind)
    elif cat == "oom":
        what = "显存溢出"
    elif cat == "too_much_memory" and case.get("ratio") is not None:
        over = case["ratio"] / case["target_ratio"] - 1
        what = (f"峰值是起始代码的 {case['ratio']:.2f} 倍，目标是不超过 {case['target_ratio']:.2f} 倍"
                f"（超出目标 {over:.0%}）")
    elif cat == "incorrect":
        errs = []
        if case.get("loss_max_rel_err") is not None:
            errs.append(f"损失的最大相对误差 {case['loss_max_rel_err']:.2g}")
        if case.get("update_rel_err") is not None and math.isfinite(case["update_rel_err"]):
            errs.append(f"参数更新的相对误差 {case['update_rel_err']:.2g}")
        what = "结果与起始代码不一致" + (f"（{'，'.join(errs)}）" if errs else f"：{_mask(_reason_body(case))}")
    elif cat in ("exception", "crashed", "invalid_submission", "exit"):
        what = f"代码运行出错：{_mask(_reason_body(case))}"
    else:
        what = _reason_body(case)
    if leak:
        tail = ("在你看到的配置上，每步留下的那点显存恰好还放得下；隐藏配置的显卡只给修好的一步留了空间。"
                "看看每步结束时的已分配显存是不是还在涨，涨的是哪些张量。")
    elif cat in ("incorrect", "exception", "crashed", "invalid_submission"):
        tail = "你的写法是不是只对题目给出的形状或数字成立？"
    elif cat in ("too_much_memory", "oom"):
        tail = f"{changes_zh}变了以后省下的比例不够：看看下面哪一类显存随这些维度变大了。"
    else:
        tail = ""
    return head + what.rstrip("。") + "。" + tail


def _reason_body(case: dict) -> str:
    """The case's reason without the category prefix fail() put in front."""
    from .kinds.common import CATEGORY_ZH as CAT

    reason = str(case.get("reason") or "")
    prefix = CAT.get(case.get("category") or "", "")
    return reason[len(prefix) + 1:] if prefix and reason.startswith(prefix + "：") else reason


# ---- an OOM's reason, in one language -------------------------------------------------------------------
_TORCH_OOM = re.compile(r"CUDA out of memory\. Tried to allocate (?P<req>[\d.]+ \w+)\. GPU (?P<gpu>\d+) has a total "
                        r"capacity of (?P<cap>[\d.]+ \w+) of which (?P<free>[\d.]+ \w+) is free\.(?P<rest>.*)", re.S)


def translate_torch_oom(message: str) -> str:
    """torch's CUDA OOM message in Chinese (what a real GPU raises); other text unchanged."""
    m = _TORCH_OOM.search(message)
    if not m:
        return message
    rest = m.group("rest")
    extra = ""
    held = re.search(r"Of the allocated memory (?P<a>[\d.]+ \w+) is allocated by PyTorch, and (?P<r>[\d.]+ \w+) is "
                     r"reserved by PyTorch but unallocated", rest)
    if held:
        extra = f"；PyTorch 已分配 {held.group('a')}，另有 {held.group('r')} 已保留但未分配"
    return (message[:m.start()] + f"CUDA 显存不足：要申请 {m.group('req')}，GPU {m.group('gpu')} 总容量 {m.group('cap')}，"
            f"空闲 {m.group('free')}{extra}。")


def explain(result: dict) -> dict:
    """An OOM verdict's reason rebuilt in Chinese from where it happened (step, operator, module,
    the learner's line); everything else unchanged."""
    if result.get("category") != "oom":
        return result
    sentence = oom_sentence(result.get("memory") or {}, (result.get("memory") or {}).get("kind", ""))
    from .kinds.common import CATEGORY_ZH as CAT
    if sentence:
        result["reason"] = f"{CAT['oom']}：{sentence}"
    else:
        result["reason"] = translate_torch_oom(result.get("reason") or "")
    return result
