"""The GPU evidence in one command: calibrate, grade every reference and starter, run the tutorials.

    vramlab evidence OUTDIR                      # on a GPU: cuda backend, gpu scale (scripts/gpu_evidence.sh)
    vramlab evidence OUTDIR --backend sim --scale ci --only ch01-estimate --calibrate-rows ROW   # the dry run

On a machine with an NVIDIA GPU this is everything the course needs a card for, in one run:
`vramlab calibrate` on every H200 reference row (CUDA and the simulated device side by side), every
exercise's reference solution and starter graded on CUDA at GPU scale (several at once, each in its
own sandbox and process, so each has its own caching allocator), and, with `--tutorials`, every
tutorial executed on the card (the tutorials measure on CUDA when there is one), each into OUTDIR.
It writes OUTDIR/evidence.json (with the machine: GPU, driver, CUDA, torch and package versions,
date, commit) and OUTDIR/summary.md. Commit evidence.json as vramlab/data/evidence/<name>.json and
the site shows it beside the simulated device's figures (docs/hooks/exercises.py).

The same code runs with `--backend sim --scale ci`, the test suite's dry run (tests/test_evidence.py),
so the plumbing is exercised on every change even where no GPU is.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE_DIR = Path(__file__).resolve().parent / "data" / "evidence"


class EvidenceError(Exception):
    """A user-facing failure before any work (Chinese message)."""


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _commit() -> str | None:
    """HEAD, marked `+dirty` when the working tree differs from it (the rows' spec_sha256 then say
    exactly which exercise code was graded)."""
    head = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if head and _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]):
        head += "+dirty"
    return head


def machine() -> dict:
    """What the evidence was measured on: enough to reproduce it and to tell two runs apart."""
    import torch

    gpu = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "gpu_count": torch.cuda.device_count() if gpu else 0,
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if gpu else None,
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if gpu else None,
        "packages": {name: _version(name) for name in ("vramlab", "transformers", "peft", "bitsandbytes", "numpy")},
    }


def spec_fingerprint(spec, scale: str) -> str:
    """What a graded figure depends on in the spec: the code, the target and the workload. The
    committed evidence of an exercise whose fingerprint changed is stale (tests/test_evidence.py)."""
    import hashlib

    text = json.dumps([spec.starter, spec.solution, spec.target_ratio, repr(getattr(spec, scale))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _grade_one(spec_id: str, code: str, backend: str, scale: str, sandbox: str, cores: int) -> dict:
    from .exercises import get_exercise
    from .grader import grade_source

    spec = get_exercise(spec_id)
    source = spec.solution if code == "solution" else spec.starter
    t0 = time.perf_counter()
    try:
        r = grade_source(spec_id, source, backend=backend, scale=scale, sandbox=sandbox, cores=cores)
    except Exception as e:  # noqa: BLE001 - a grader failure is evidence too: recorded, not fatal
        return {"exercise": spec_id, "code": code, "error": f"{type(e).__name__}: {e}",
                "seconds": round(time.perf_counter() - t0, 1)}
    keep = ("passed", "score", "max_score", "category", "ratio", "target_ratio", "peak_bytes", "baseline_peak_bytes",
            "hidden_cases", "hidden_passed", "time_ratio", "sandboxed", "seconds")
    row = {"exercise": spec_id, "code": code, "spec_sha256": spec_fingerprint(spec, scale),
           **{k: r.get(k) for k in keep}}
    row["expected"] = code == "solution"            # a reference passes, a starter fails
    row["agrees"] = bool(r.get("passed")) == row["expected"]
    if not row["agrees"]:
        row["reason"] = r.get("reason")
    return row


def grade_all(backend: str, scale: str, only: list[str] | None, jobs: int, sandbox: str = "auto",
              progress=print) -> list[dict]:
    """Every chosen exercise's reference and starter, `jobs` gradings at a time."""
    from .exercises import EXERCISES

    chosen = [s for s in EXERCISES.values() if not only or s.id in only]
    cores = max(1, (os.cpu_count() or 1) // max(1, jobs))
    todo = [(s.id, code) for s in chosen for code in ("solution", "starter")]
    rows = []
    with cf.ThreadPoolExecutor(max(1, jobs)) as pool:       # each grading runs in its own processes
        futures = {pool.submit(_grade_one, sid, code, backend, scale, sandbox, cores): (sid, code)
                   for sid, code in todo}
        for fut in cf.as_completed(futures):
            row = fut.result()
            rows.append(row)
            mark = "出错" if "error" in row else ("一致" if row["agrees"] else "不一致")
            progress(f"  [{len(rows)}/{len(todo)}] {row['exercise']} {row['code']}: {mark}"
                     + (f"（比值 {row['ratio']:.3f}）" if row.get("ratio") is not None else ""))
    order = {sid: i for i, (sid, _) in enumerate(todo)}
    return sorted(rows, key=lambda r: (order[r["exercise"]], r["code"] != "solution"))


def run_tutorials(out: Path, only: list[str] | None, jobs: int, progress=print) -> list[dict]:
    """Execute the tutorials into OUTDIR/tutorials (never over the committed ones in docs/)."""
    from . import tutorials

    sources = [s for s in tutorials.sources() if not only or s.stem in only]
    target = out / "tutorials"
    target.mkdir(parents=True, exist_ok=True)
    rows = []
    t0 = time.perf_counter()
    for source, result in tutorials.execute_many([(s, target / f"{s.stem}-tutorial.ipynb") for s in sources], jobs):
        ok = not isinstance(result, Exception)
        rows.append({"tutorial": source.stem, "ok": ok,
                     **({"notebook": str(Path(result).relative_to(out))} if ok else
                        {"error": f"{type(result).__name__}: {str(result)[-500:]}"})})
        progress(f"  教程 {source.stem}：{'完成' if ok else '失败'}（已用 {time.perf_counter() - t0:.0f} s）")
    return sorted(rows, key=lambda r: r["tutorial"])


def collect(out: Path, backend: str = "auto", scale: str = "auto", only: list[str] | None = None,
            calibrate_rows: str | None = None, tutorials: bool = False, tutorial_only: list[str] | None = None,
            jobs: int | None = None, sandbox: str = "auto", progress=print) -> dict:
    import torch

    from .calibrate import calibrate

    gpu = torch.cuda.is_available()
    backend = ("cuda" if gpu else "sim") if backend == "auto" else backend
    scale = ("gpu" if backend == "cuda" else "ci") if scale == "auto" else scale
    if backend == "cuda" and not gpu:
        raise EvidenceError("--backend cuda 需要一块 NVIDIA GPU，这台机器上 torch.cuda.is_available() 为 False")
    jobs = jobs or (4 if backend == "cuda" else 1)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = {"format": 1, "backend": backend, "scale": scale, "machine": machine()}
    progress(f"机器：{report['machine']['gpu'] or 'CPU（模拟设备）'}，torch {report['machine']['torch']}")
    progress("1/3 校准（H200 参考表的每一行）…")
    report["calibration"] = calibrate(backends="sim,cuda" if backend == "cuda" else "sim", rows=calibrate_rows)
    progress(f"2/3 评分：每道练习的参考答案和起始代码（{backend}，{scale} 规模，{jobs} 个并行）…")
    report["gradings"] = grade_all(backend, scale, only, jobs, sandbox, progress)
    if tutorials:
        progress("3/3 教程：逐个执行（输出写在 OUTDIR/tutorials）…")
        report["tutorials"] = run_tutorials(out, tutorial_only, jobs, progress)
    else:
        report["tutorials"] = []
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "evidence.json").write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(report), encoding="utf-8")
    return report


def summary_markdown(report: dict) -> str:
    m = report["machine"]
    where = f"{m['gpu']}（驱动 {m['driver']}，CUDA {m['cuda']}）" if m["gpu"] else f"CPU 上的模拟设备（{m['cpu_cores']} 核）"
    lines = [f"# vramlab 证据：{report['backend']} 后端，{report['scale']} 规模", "",
             f"- 机器：{where}；torch {m['torch']}；Python {m['python']}",
             f"- 包：" + "，".join(f"{k} {v}" for k, v in m["packages"].items() if v),
             f"- 时间：{m['date']}；提交 {m['commit'] or '未知'}；用时 {report['seconds']} s", ""]
    cal = report["calibration"]
    if cal["rows"]:
        lines += ["## 校准（稳态峰值，MiB）", "", "| 配置 | H200 参考 | " + " | ".join(cal["backends"]) + " |",
                  "|---|---:|" + "---:|" * len(cal["backends"])]
        for r in cal["rows"]:
            cells = " | ".join(f"{r[b + '_steady_mib']:.0f}（{r[b + '_over_h200']:.3f}）" for b in cal["backends"])
            lines.append(f"| {r['name']} | {r['h200_steady_mib']} | {cells} |")
        lines.append("")
    rows = report["gradings"]
    bad = [r for r in rows if not r.get("agrees")]
    lines += ["## 评分：参考答案应通过、起始代码应不通过", "",
              f"{len(rows)} 次评分，{len(rows) - len(bad)} 次与预期一致，{len(bad)} 次不一致或出错。", "",
              "| 练习 | 代码 | 结果 | 比值 | 目标 |", "|---|---|---|---:|---:|"]
    for r in rows:
        verdict = "出错：" + r["error"] if "error" in r else ("通过" if r["passed"] else f"未通过（{r['category']}）")
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") is not None else "—"
        target = f"{r['target_ratio']:.2f}" if r.get("target_ratio") is not None else "—"
        lines.append(f"| {r['exercise']} | {'参考答案' if r['code'] == 'solution' else '起始代码'} | {verdict} | {ratio} | {target} |")
    if report["tutorials"]:
        ok = sum(r["ok"] for r in report["tutorials"])
        lines += ["", "## 教程", "", f"{ok}/{len(report['tutorials'])} 份执行完成（notebook 在 tutorials/ 下）。"]
        lines += [f"- {r['tutorial']}：{r['error']}" for r in report["tutorials"] if not r["ok"]]
    return "\n".join(lines) + "\n"


# -- what the site shows ------------------------------------------------------------------------------
def committed() -> dict[str, dict]:
    """The committed evidence files (vramlab/data/evidence/*.json), by backend: the site's source."""
    found = {}
    for path in sorted(EVIDENCE_DIR.glob("*.json")):
        report = json.loads(path.read_text(encoding="utf-8"))
        found.setdefault(report["backend"], {**report, "file": path.name})
    return found


def exercise_figures(exercise_id: str, reports: dict[str, dict] | None = None) -> dict[str, dict | None]:
    """{backend: {"solution": row, "starter": row, "provenance": str} or None} for one exercise."""
    reports = committed() if reports is None else reports
    out = {}
    for backend in ("sim", "cuda"):
        report = reports.get(backend)
        rows = {r["code"]: r for r in (report or {}).get("gradings", []) if r["exercise"] == exercise_id}
        if not rows:
            out[backend] = None
            continue
        m = report["machine"]
        where = m["gpu"] if m["gpu"] else "CPU 上的模拟设备"
        out[backend] = {**rows, "provenance": f"{where}，{report['scale']} 规模，torch {m['torch']}，{m['date'][:10]}，"
                                              f"vramlab/data/evidence/{report['file']}"}
    return out


def build_parser():
    from .args import ChineseArgumentParser

    p = ChineseArgumentParser(prog="vramlab evidence", description="在一台机器上收集全部证据：校准、评分、教程")
    p.add_argument("out", help="输出文件夹（写 evidence.json 和 summary.md）")
    p.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto")
    p.add_argument("--scale", choices=("auto", "gpu", "ci"), default="auto")
    p.add_argument("--only", help="只评这些练习（逗号分隔）")
    p.add_argument("--calibrate-rows", help="只校准这些参考行（逗号分隔；默认全部）")
    p.add_argument("--tutorials", action="store_true", help="也执行全部教程（写到 OUTDIR/tutorials）")
    p.add_argument("--tutorial-only", help="只执行这些教程，如 ch07,ch14")
    p.add_argument("--jobs", type=int, default=None, help="同时评几份（cuda 默认 4，sim 默认 1）")
    p.add_argument("--no-sandbox", action="store_true")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    from .exercises import EXERCISES
    from .reference import reference_rows

    only = a.only.split(",") if a.only else None
    unknown = [x for x in only or [] if x not in EXERCISES]
    if unknown:
        p.error(f"没有这些练习：{'、'.join(unknown)}")
    if a.calibrate_rows:
        names = {r.name for r in reference_rows()}
        unknown = [x for x in a.calibrate_rows.split(",") if x not in names]
        if unknown:
            p.error(f"参考表里没有这些行：{'、'.join(unknown)}")
    if a.jobs is not None and a.jobs < 1:
        p.error("--jobs 至少为 1")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        p.error(f"{out} 已存在且不是文件夹")
    try:
        report = collect(out, a.backend, a.scale, only, a.calibrate_rows, a.tutorials,
                         a.tutorial_only.split(",") if a.tutorial_only else None, a.jobs,
                         "off" if a.no_sandbox else "auto")
    except EvidenceError as e:
        print(f"错误：{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("已中断：没有写出 evidence.json（已写出的教程 notebook 留在 OUTDIR/tutorials）。", file=sys.stderr)
        return 130
    bad = [r for r in report["gradings"] if not r.get("agrees")]
    print(f"写好了 {out / 'evidence.json'} 和 {out / 'summary.md'}；{len(bad)} 次评分与预期不一致"
          f"（用时 {report['seconds']:.0f} s）")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
