"""How long a grading takes, and how fast a class is graded, measured in one run.

    vramlab grade-bench [--only IDS] [--starters] [--compare] [--load N] [--class-size N] [--json]

For every exercise it grades the reference solution once to warm up (a warm worker, the starter's
run in the baseline cache), then once more and reports that second grading's latency: what a
learner's second `vramlab.check()` and every grading of a batch after the first one take.
`--compare` also grades each solution the way the grader did before warm workers and the cache
(a fresh interpreter per run, the starter measured in every grading) and prints both latencies
and their ratio, measured in the same run on the same machine. `--load N` grades each solution
again while N busy-loop processes run (default: all cores but one busy) and prints that latency
and its ratio to the idle one (grader/threads.py picks the threads from the load). `--class-size N` then grades N
copies of every chosen exercise's solution through the batch (`vramlab.grader.batch`, 2 workers, each
grading on its share of the cores) and prints the class throughput and what 30 students handing in
every chosen exercise would take at that rate (`--chapters`: the 30 chapters' exercises, the
issue's 30 x 30; all 33 with the stage challenges: 990 gradings). One untimed copy per exercise
goes first (see _class); the projection adds its time once.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = {1: 2.0, 2: 4.0}         # issue 14: median per grading, single-process and 2-rank kinds
GOAL_LOADED = 1.3                 # issue 33: with busy processes on all cores but one, at most 1.3x the idle time
CLASS_STUDENTS = 30               # issue 14: a class of 30 hands in each exercise once


def select(only: list[str] | None, chapters: bool = False) -> list[str] | None:
    """The exercises to measure: `only` (None: all); with `chapters`, only the chapters' own
    exercises (ids chNN-..., one per chapter), not the stage challenges."""
    if not chapters:
        return only
    from ..exercises import EXERCISES

    return [i for i in (only or EXERCISES) if i.startswith("ch")]


def _grade(spec, source: str, scale: str, backend: str, sandbox: str, cold: bool = False) -> tuple[dict, float]:
    from . import slots
    from .core import grade_source

    saved = slots.ENABLED
    slots.ENABLED = saved and not cold
    try:
        t0 = time.perf_counter()
        r = grade_source(spec.id, source, backend=backend, scale=scale, sandbox=sandbox, reuse_baseline=not cold)
        return r, time.perf_counter() - t0
    finally:
        slots.ENABLED = saved


def run(as_json: bool = False, scale: str = "ci", measure_starters: bool = False, backend: str = "sim",
        only: list[str] | None = None, sandbox: str = "auto", compare: bool = False, class_size: int = 0,
        workers: int = 2, class_only: bool = False, load: int = 0, record: bool = False) -> list[dict]:
    """`load`: N > 0 also grades each solution while N busy-loop processes run (busy_load) and
    reports that latency next to the idle one, measured in the same run. `record` appends the idle
    and loaded seconds to the performance history (benchmark "grade-load")."""
    from ..exercises import EXERCISES

    rows = []
    chosen = [s for s in EXERCISES.values() if not only or s.id in only]
    for spec in ([] if class_only else chosen):
        world = spec.ci.settings.world_size if scale == "ci" else spec.gpu.settings.world_size
        codes = [("solution", spec.solution)] + ([("starter", spec.starter)] if measure_starters else [])
        for code, src in codes:
            _grade(spec, src, scale, backend, sandbox)                     # warm-up: worker, cache
            r, seconds = _grade(spec, src, scale, backend, sandbox)
            row = {"exercise": spec.id, "kind": spec.kind, "ranks": world, "code": code, "passed": r["passed"],
                   "category": r["category"], "seconds": round(seconds, 2), "peak_bytes": r["peak_bytes"],
                   "baseline_peak_bytes": r["baseline_peak_bytes"], "ratio": r["ratio"],
                   "target_ratio": spec.target_ratio, "reason": r["reason"], "sandboxed": r.get("sandboxed"),
                   "observed_excess_bytes": r.get("observed_excess_bytes"), "cold_seconds": None,
                   "cpu_seconds": r.get("cpu_seconds")}
            if compare:
                _, cold = _grade(spec, src, scale, backend, sandbox, cold=True)
                row["cold_seconds"] = round(cold, 2)
            if load:
                from .threads import torch_threads
                with busy_load(load):
                    _grade(spec, src, scale, backend, sandbox)     # warm-up at the thread count load leaves
                    row["loaded_threads"] = torch_threads(world)
                    r_loaded, loaded = _grade(spec, src, scale, backend, sandbox)
                row.update(load=load, loaded_seconds=round(loaded, 2), loaded_passed=r_loaded["passed"],
                           loaded_ratio=round(loaded / seconds, 2) if seconds else None)
            rows.append(row)
            if not as_json:
                _print_row(row)
    if class_size and chosen:
        rows_class = _class(chosen, class_size, backend, scale, sandbox, as_json, workers)
    else:
        rows_class = None
    if as_json:
        print(json.dumps({"gradings": rows, "class": rows_class}, ensure_ascii=False))
    elif rows:
        _summary(rows)
    if record and load and rows:
        _record_load(rows, load, only)
    return rows


def _record_load(rows: list[dict], load: int, only: list[str] | None) -> None:
    """One history entry: each exercise's idle and loaded seconds, their ratio and the threads used;
    the thread rule in force is named (a fixed $VRAMLAB_GRADE_CORES is the old, load-blind rule)."""
    from .. import perf
    from .threads import configured_cores

    fixed = configured_cores()
    figures = {"规则": f"固定 {fixed} 个线程" if fixed else "按负载选线程", "忙进程": load}
    for r in rows:
        figures[r["exercise"]] = (f"{r['seconds']:.2f} s → {r['loaded_seconds']:.2f} s（{r['loaded_ratio']:.2f} 倍，"
                                  f"{r['loaded_threads']} 线程{'' if r['loaded_passed'] else '，未通过'}）")
    ratios = [r["loaded_ratio"] for r in rows if r.get("loaded_ratio")]
    figures["中位数倍数"] = round(statistics.median(ratios), 2) if ratios else None
    figures["目标"] = f"≤ {GOAL_LOADED:g} 倍"
    env = f"VRAMLAB_GRADE_CORES={fixed} " if fixed else ""
    perf.record("grade-load", f"{env}vramlab grade-bench --load {load}" + (f" --only {','.join(only)}" if only else "")
                + " --record", figures, note="空闲与有忙进程时的评分耗时，同一次运行、同一台机器")


def noise(ids: list[str] | None, repeat: int, alternatives: str | None, backend: str = "sim", scale: str = "ci",
          as_json: bool = False, record: bool = False) -> list[dict]:
    """How much memory honest code uses beyond what it reports, against the tolerance (issue 28).

    Grades each chosen exercise's reference solution and, with `alternatives` (a folder such as
    tests/alternatives, one sub-folder per exercise), every file there whose first line is
    `# expect: pass`, `repeat` times each, and prints the distribution of the out-of-process reading's
    excess over the starter's (observed_excess_bytes) next to the allowance it is judged against.
    Run it on a loaded machine too (`--load N`, or other work running): the tolerance must hold there."""
    from ..exercises import EXERCISES
    from . import observer
    from .core import grade_source

    rows = []
    for spec in EXERCISES.values():
        if ids and spec.id not in ids:
            continue
        sources = [("solution", spec.solution)]
        folder = Path(alternatives) / spec.id if alternatives else None
        if folder is not None and folder.is_dir():
            for path in sorted(folder.glob("*.py")):
                text = path.read_text(encoding="utf-8")
                if text.splitlines()[0].strip() == "# expect: pass":
                    sources.append((path.stem, text))
        for name, source in sources:
            excesses, allowed, accounting = [], None, None
            for _ in range(repeat):
                r = grade_source(spec.id, source, backend=backend, scale=scale)
                if r.get("observed_excess_bytes") is not None:
                    excesses.append(r["observed_excess_bytes"])
                    base = r.get("baseline_peak_bytes") or 0
                    allowed = max(observer.TOLERANCE_BYTES, int(observer.TOLERANCE_FRACTION * base))
                accounting = r.get("memory_accounting") or accounting
            if not excesses:
                continue
            row = {"exercise": spec.id, "code": name, "runs": len(excesses), "accounting": accounting,
                   "min_bytes": min(excesses), "median_bytes": int(statistics.median(excesses)),
                   "max_bytes": max(excesses), "allowed_bytes": allowed,
                   "max_share_of_allowed": round(max(excesses) / allowed, 3) if allowed else None}
            rows.append(row)
            if not as_json:
                mib = 2 ** 20
                print(f"{row['exercise']:<22} {name:<34} {row['runs']} 次（{accounting}）：进程外多用 "
                      f"最小 {row['min_bytes'] / mib:+6.1f} / 中位 {row['median_bytes'] / mib:+6.1f} / "
                      f"最大 {row['max_bytes'] / mib:+6.1f} MiB，允许 {allowed / mib:.1f} MiB"
                      f"（最大占允许的 {row['max_share_of_allowed']:.0%}）", flush=True)
    if rows and not as_json:
        worst = max(rows, key=lambda r: r["max_share_of_allowed"] or 0)
        print(f"诚实提交的最大进程外多用占允许误差的 {worst['max_share_of_allowed']:.0%}（{worst['exercise']} {worst['code']}）")
    if as_json:
        print(json.dumps({"noise": rows}, ensure_ascii=False))
    if record and rows:
        from .. import perf
        worst = max(rows, key=lambda r: r["max_share_of_allowed"] or 0)
        perf.record("grade-noise", f"vramlab grade-bench --noise {repeat}" + (f" --alternatives {alternatives}" if alternatives else "")
                    + (f" --only {','.join(ids)}" if ids else ""),
                    {"练习": len({r["exercise"] for r in rows}), "写法": len(rows), "每种评次数": repeat,
                     "记账": "/".join(sorted({str(r["accounting"]) for r in rows})),
                     "最大多用 MiB": round(max(r["max_bytes"] for r in rows) / 2 ** 20, 1),
                     "中位数的中位 MiB": round(statistics.median(r["median_bytes"] for r in rows) / 2 ** 20, 1),
                     "最大占容差": worst["max_share_of_allowed"]},
                    note=f"最紧的是 {worst['exercise']} {worst['code']}")
    return rows


@contextlib.contextmanager
def busy_load(n: int):
    """`n` busy-loop processes for as long as the block runs: other work on the machine (a
    browser, an IDE, a build). Each spins on one core; each leaves by itself once its parent is
    gone (checked every few tens of milliseconds), so a killed benchmark leaves no spinning process."""
    spin = ("import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(200000):\n        pass\n")
    procs = [subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(max(0, n))]
    try:
        time.sleep(0.5)                 # running, and seen by the run queue, before anything is timed
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def default_load() -> int:
    """Busy processes on all usable cores but one: the issue's "busy laptop"."""
    from .threads import usable_cores

    return max(1, usable_cores() - 1)


def _print_row(row: dict) -> None:
    mib = (row["peak_bytes"] or 0) / 2**20
    base = (row["baseline_peak_bytes"] or 0) / 2**20
    ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "  -  "
    excess = row["observed_excess_bytes"]
    seen = f"{excess / 2**20:+6.1f} MiB" if excess is not None else "    -    "
    cpu = f"（学员代码 CPU {row['cpu_seconds']:5.2f} s）" if row.get("cpu_seconds") is not None else ""
    cold = f"  以前的做法 {row['cold_seconds']:5.1f} s（{row['cold_seconds'] / row['seconds']:4.1f} 倍）" \
        if row["cold_seconds"] else ""
    loaded = (f"  {row['load']} 个忙进程时 {row['loaded_seconds']:5.2f} s（{row['loaded_ratio']:.2f} 倍，"
              f"{row['loaded_threads']} 个线程{'' if row['loaded_passed'] else '，未通过'}）") if row.get("load") else ""
    print(f"{row['exercise']:<22} {row['code']:<8} {'通过' if row['passed'] else '未通过':<4} 峰值 {mib:8.1f} MiB  "
          f"起始 {base:8.1f} MiB  比值 {ratio}  目标 {row['target_ratio']:.2f}  进程外读数差 {seen}  "
          f"耗时 {row['seconds']:5.2f} s{cpu}{cold}{loaded}", flush=True)


def _summary(rows: list[dict]) -> None:
    for ranks in (1, 2):
        secs = [r["seconds"] for r in rows if r["ranks"] == ranks]
        if not secs:
            continue
        line = (f"{ranks} 个进程的练习（{len(secs)} 次评分）：中位数 {statistics.median(secs):.2f} s，"
                f"最长 {max(secs):.2f} s（目标中位数 ≤ {GOAL_S[ranks]:.0f} s）")
        cpu = [r["cpu_seconds"] for r in rows if r["ranks"] == ranks and r.get("cpu_seconds") is not None]
        if cpu:     # not slowed by other load on the machine: what the gradings themselves cost
            line += f"；学员代码的 CPU 时间合计 {sum(cpu):.1f} s，中位数 {statistics.median(cpu):.2f} s"
        cold = [r["cold_seconds"] for r in rows if r["ranks"] == ranks and r["cold_seconds"]]
        if cold:
            line += f"；以前的做法中位数 {statistics.median(cold):.2f} s，快了 {statistics.median(cold) / statistics.median(secs):.1f} 倍"
        loaded = [r["loaded_ratio"] for r in rows if r["ranks"] == ranks and r.get("loaded_ratio")]
        if loaded:
            line += (f"；有 {rows[0]['load']} 个忙进程时是空闲时的 {statistics.median(loaded):.2f} 倍（中位数，"
                     f"最多 {max(loaded):.2f} 倍；目标 ≤ {GOAL_LOADED:g} 倍）")
        print(line)
    excesses = [abs(r["observed_excess_bytes"]) for r in rows if r["observed_excess_bytes"] is not None]
    print(f"进程外读数与起始代码之差的最大绝对值 {max(excesses, default=0) / 2**20:.1f} MiB"
          f"（沙箱：{'是' if rows[0]['sandboxed'] else '否'}）")


def _class(chosen, size: int, backend: str, scale: str, sandbox: str, as_json: bool, workers: int = 2) -> dict:
    """Grade `size` students' copies of each chosen solution through the batch: gradings/minute.

    One pool of `workers` workers serves both rounds. The first, untimed, grades one copy per exercise: the
    workers start their sandboxes and the starter's run is measured at the batch's share of the
    cores, what a class pays once. The second is timed: the rate a class of any size is graded at."""
    from .batch import grade_many, start_pool, stop_pool

    sandbox = "require" if sandbox == "auto" else sandbox
    with tempfile.TemporaryDirectory(prefix="vramlab-class-") as tmp:
        def copies(names):
            paths = []
            for spec in chosen:
                for name in names:
                    folder = Path(tmp) / name / spec.id
                    folder.mkdir(parents=True)
                    (folder / f"{spec.id}.py").write_text(spec.solution, encoding="utf-8")
                    paths.append(str(folder / f"{spec.id}.py"))
            return paths

        pool, stop, pool_tmp = start_pool(workers)
        try:
            t0 = time.perf_counter()
            grade_many(copies(["first"]), workers=workers, backend=backend, scale=scale, progress=False,
                       sandbox=sandbox, executor=pool)
            once = time.perf_counter() - t0
            paths = copies([f"student{i:03d}" for i in range(size)])
            t0 = time.perf_counter()
            rows = grade_many(paths, workers=workers, backend=backend, scale=scale, progress=not as_json, sandbox=sandbox,
                              executor=pool)
            wall = time.perf_counter() - t0
        finally:
            stop_pool(pool, stop, pool_tmp, kill=False)
    per_minute = len(rows) / wall * 60
    class_gradings = CLASS_STUDENTS * len(chosen)      # every student hands in every chosen exercise
    result = {"gradings": len(rows), "wall_seconds": round(wall, 1), "per_minute": round(per_minute, 1),
              "passed": sum(1 for r in rows if r.get("passed")), "once_seconds": round(once, 1), "workers": workers,
              "exercises": len(chosen), "class_gradings": class_gradings,
              "projected_class_minutes": round((once + class_gradings / per_minute * 60) / 60, 1)}
    if not as_json:
        print(f"全班：先评每题一份（启动评分进程、按批量的线程数测起始代码，一个班只付一次）{once:.0f} s；"
              f"再评 {len(rows)} 份（{result['passed']} 份通过），{workers} 个并行，用时 {wall:.0f} s，每分钟 {per_minute:.1f} 份；"
              f"按这个速度，{CLASS_STUDENTS} 人 × {len(chosen)} 题（{class_gradings} 份）约 "
              f"{result['projected_class_minutes']:.1f} 分钟（含只付一次的部分；目标：30 人 × 30 题 ≤ 15 分钟）")
    return result
