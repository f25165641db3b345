"""Grade many submissions on one machine, with bounded parallelism and a progress bar.

    python -m vramlab.batch --workers 2 --csv nbgrader/vramlab_grades.csv nbgrader/submitted/*/*/*.ipynb

    from vramlab.batch import grade_many
    rows = grade_many(["nbgrader/submitted/alice/ch07-checkpoint/ch07-checkpoint.ipynb"], workers=2)

Every submission goes through `vramlab.grader.grade_file` (the same isolated grader that
`vramlab.check()` and `vramlab grade` use) in a fixed-size process pool. A submission that cannot be
graded (broken file, grader error) becomes one row with score 0 and the reason; it never stops the
batch. The exercise id and the student id are read from nbgrader's layout
`.../<student>/<exercise>/<file>.ipynb` (or given with `--exercise`).

For more than one machine, use an existing scheduler (Slurm job array, Kubernetes Indexed Job,
see docs/guide/grading.md) running `vramlab grade EXERCISE PATH --json` per submission.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

FIELDS = ["student", "exercise", "path", "passed", "score", "max_score", "ratio", "target_ratio", "peak_bytes",
          "baseline_peak_bytes", "correct", "category", "reason", "backend", "seconds"]


def infer_job(path, exercise: str | None = None) -> tuple[str, str, str]:
    """(student, exercise, path) for a submission path in nbgrader's layout."""
    from .exercises import EXERCISES

    p = Path(path)
    if exercise is None:
        for candidate in (p.parent.name, p.stem):
            if candidate in EXERCISES:
                exercise = candidate
                break
    student = p.parent.parent.name if p.parent.name == exercise else p.parent.name
    return student, exercise or "", str(p)


def _grade_one(job: tuple[str, str, str], backend: str, scale: str, timeout_s, sandbox: str = "require") -> dict:
    student, exercise, path = job
    row = {"student": student, "exercise": exercise, "path": path, "passed": False, "score": 0}
    t0 = time.perf_counter()
    try:
        if not exercise:
            raise ValueError(f"无法从路径判断练习编号：{path}（用 --exercise 指定）")
        from .grader import grade_file

        result = grade_file(exercise, path, backend=backend, scale=scale, timeout_s=timeout_s, sandbox=sandbox)
        row.update({k: result.get(k) for k in FIELDS if k in result and k not in ("student", "path")})
    except Exception as e:  # noqa: BLE001 - one broken submission never fails the batch
        row.update(category="grader_error", reason=f"{type(e).__name__}: {e}")
    row.setdefault("seconds", round(time.perf_counter() - t0, 2))
    return row


def _resolve_backend(backend: str) -> str:
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "sim"


def grade_many(paths, workers: int = 2, exercise: str | None = None, backend: str = "sim", scale: str | None = None,
               timeout_s: float | None = None, progress: bool = True, sandbox: str = "require") -> list[dict]:
    """Grade `paths` (submission files) with at most `workers` submissions at a time; returns one
    row per path, in the order given. Each grading itself starts two isolated children (the starter
    and the submission), so `workers` = 1 per GPU, or about cores/2 on the simulated device.
    `backend="sim"` with the ci scale is what `vramlab.check()` in the notebook uses. Learner code
    runs in the OS sandbox: without bubblewrap the batch refuses to start (`sandbox="off"` to
    override, only for submissions you trust)."""
    from .grader import policy

    if sandbox == "require" and policy.bwrap_path() is None:
        raise SystemExit(policy.NO_SANDBOX_REFUSAL)
    backend = _resolve_backend(backend)
    scale = scale or ("gpu" if backend == "cuda" else "ci")
    jobs = [infer_job(p, exercise) for p in paths]
    rows: list[dict | None] = [None] * len(jobs)
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(jobs), desc="评分", unit="份", file=sys.stderr)
        except ImportError:          # pragma: no cover - tqdm is a dependency
            bar = None
    ctx = multiprocessing.get_context("spawn")     # no fork of a process that may hold CUDA / threads
    with ProcessPoolExecutor(max_workers=max(1, int(workers)), mp_context=ctx) as pool:
        futures = {pool.submit(_grade_one, job, backend, scale, timeout_s, sandbox): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                rows[i] = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker that died (e.g. killed) is one failed row
                student, ex, path = jobs[i]
                rows[i] = {"student": student, "exercise": ex, "path": path, "passed": False, "score": 0,
                           "category": "grader_error", "reason": f"{type(e).__name__}: {e}"}
            if bar is not None:
                r = rows[i]
                bar.set_postfix_str(f"{r['student']}/{r['exercise']}: {r.get('score', 0)} 分")
                bar.update(1)
    if bar is not None:
        bar.close()
    return [r for r in rows if r is not None]


def write_csv(rows, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vramlab.batch", description="并行评分多份提交（进程池 + 进度条）")
    parser.add_argument("paths", nargs="*", help="提交的文件；默认 nbgrader/submitted/*/*/*.ipynb")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", 2)), help="同时评分的份数（默认 2）")
    parser.add_argument("--exercise", help="练习编号（默认从路径 <学号>/<编号>/ 推断）")
    parser.add_argument("--backend", choices=("sim", "cuda", "auto"), default="sim",
                        help="sim（默认，与 notebook 里的 check() 相同）、cuda，或 auto（有 GPU 就用 cuda）")
    parser.add_argument("--scale", choices=("ci", "gpu"), default=None, help="默认：cuda 用 gpu，sim 用 ci")
    parser.add_argument("--timeout", type=float, default=None, help="每份提交的超时（秒）")
    parser.add_argument("--csv", help="把结果写成 CSV")
    parser.add_argument("--json", action="store_true", help="每份提交输出一行 JSON")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="没有 bubblewrap 时也评分（学员代码不在操作系统沙箱里：只在信任提交者时使用）")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(glob.glob(os.path.join("nbgrader", "submitted", "*", "*", "*.ipynb")))
    if not paths:
        print("没有找到要评分的提交。", file=sys.stderr)
        return 2
    rows = grade_many(paths, workers=args.workers, exercise=args.exercise, backend=args.backend, scale=args.scale,
                      timeout_s=args.timeout, sandbox="off" if args.no_sandbox else "require")
    if args.csv:
        write_csv(rows, args.csv)
    for r in rows:
        if args.json:
            print(json.dumps(r, ensure_ascii=False))
        else:
            mark = "通过" if r.get("passed") else "未通过"
            print(f"{r['student']}\t{r['exercise']}\t{r.get('score', 0)}/{r.get('max_score', '?')}\t{mark}\t{r.get('reason', '')}")
    if args.csv:
        print(f"已写入 {args.csv}（{len(rows)} 行）", file=sys.stderr)
    return 1 if any(r.get("category") == "grader_error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
