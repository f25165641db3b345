"""Ch09: pipeline schedules GPipe vs 1F1B on p = 4 stages, m = 8 micro-batches (forward 1, backward 2 units).

The schedule is computed by list scheduling with the real dependencies (F on stage s needs F on s-1;
B on stage s needs B on s+1 and its own F). From it: makespan, bubble share (p-1)/(m+p-1) and how many
micro-batches stage 0 holds activations for at once (GPipe m, 1F1B p), the chapter's numbers.
"""
from diagrams.svg import MUTED, Figure

P, M, TF, TB = 4, 8, 1, 2


def orders(kind):
    if kind == "gpipe":
        return [[("F", j) for j in range(M)] + [("B", j) for j in range(M)] for _ in range(P)]
    out = []
    for s in range(P):
        w = min(P - s - 1, M)
        ops = [("F", j) for j in range(w)]
        for j in range(M - w):
            ops += [("F", w + j), ("B", j)]
        out.append(ops + [("B", j) for j in range(M - w, M)])
    return out


def schedule(kind):
    """{(stage, op, mb): (start, end)} by scheduling each stage's ops in order as soon as deps are done."""
    todo, done, free = orders(kind), {}, [0] * P
    while any(todo):
        for s in range(P):
            if not todo[s]:
                continue
            op, j = todo[s][0]
            deps = [(s - 1, "F", j)] if op == "F" and s else []
            deps += ([(s + 1, "B", j)] if s < P - 1 else []) + [(s, "F", j)] if op == "B" else []
            if all(d in done for d in deps):
                start = max([free[s]] + [done[d][1] for d in deps])
                done[(s, op, j)] = (start, start + (TF if op == "F" else TB))
                free[s] = done[(s, op, j)][1]
                todo[s].pop(0)
    return done


def in_flight(sched, s=0):
    events = sorted((t, +1 if op == "F" else -1) for (st, op, _), (t0, t1) in sched.items() if st == s
                    for t in [t1 if op == "F" else t0])
    n = best = 0
    for _, d in events:
        n += d
        best = max(best, n)
    return best


def draw():
    W, x0, u, row = 780, 70, 20, 22
    f = Figure("ch09-pipeline-schedules", "4 段流水线、8 个微批次：GPipe 与 1F1B 的调度和气泡",
               "两种调度的总时长相同，气泡都占 3/11 ≈ 27.3%；但 GPipe 先做完 8 个前向再做反向，第 0 段要同时保存 8 个微批次的激活值，"
               "1F1B 做完一个前向就尽快做一个反向，第 0 段最多只挂 4 个。", W, 300)
    for k, (kind, title) in enumerate([("gpipe", "GPipe"), ("1f1b", "1F1B（PipeDream-Flush）")]):
        sched, top = schedule(kind), 34 + k * 130
        span = max(t1 for _, t1 in sched.values())
        bubble = 1 - P * M * (TF + TB) / (P * span)
        f.text(x0, top - 10, title, anchor="start", bold=True)
        f.text(x0 + span * u, top - 10, f"总时长 {span}，气泡 {bubble:.1%}，第 0 段最多挂 {in_flight(sched)} 个微批次",
               anchor="end", size=12)
        for s in range(P):
            y = top + s * row
            f.text(x0 - 8, y + 15, f"段 {s}", anchor="end", size=12, color=MUTED)
            f.rect(x0, y, span * u, row - 3, "idle", rx=0, dash=True)
        for (s, op, j), (t0, t1) in sched.items():
            y = top + s * row
            f.rect(x0 + t0 * u, y, (t1 - t0) * u, row - 3, "param" if op == "F" else "grad", rx=2)
            f.text(x0 + (t0 + t1) / 2 * u, y + 14, str(j + 1), size=12)
        f.line(x0, top + P * row + 2, x0 + span * u, top + P * row + 2, width=1)
        for t in range(0, span + 1, 3):
            f.text(x0 + t * u, top + P * row + 16, str(t), size=12, color=MUTED)
    f.legend(x0, 290, [("param", "前向（1 个单位）"), ("grad", "反向（2 个单位）"), ("idle", "气泡")])
    f.text(W - 16, 292, "格中数字 = 微批次编号", anchor="end", size=12, color=MUTED)
    return [f]
