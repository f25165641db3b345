"""Grade a class on a Slurm cluster: one job array, one journal per array task, the batch's CSV.

    vramlab grade-class --slurm --csv grades.csv --cpus-per-task 2 --time 00:30:00 SUBMISSIONS...
    vramlab grade-class --slurm --partition gpu --gres gpu:1 --backend cuda --cpus-per-task 8 --mem 32G ...
    vramlab grade-class --slurm --no-wait ...         # submit and return; prints the run id
    vramlab grade-class --attach RUN --csv grades.csv # wait for that run again, then write the CSV
    vramlab grade-class SUBMISSIONS...                # no --slurm: the local batch (vramlab/grader/batch.py)

The submitting command keys every submission as the local batch does (batch.job_key: exercise,
student, the file's bytes, backend, scale), reads every journal already under the state folder,
and submits ONE job array (`sbatch --array`) for the submissions that have no grade yet. Array
task K grades its share (every T-th of them) with `batch.grade_many`: the same warm sandboxes,
memory cgroups, observation and per-grading deadlines as a local batch. It appends to its own
journal, `STATE/runs/RUN/journal/task-K.jsonl`: batch.py's rows (one fsynced JSON line per
finished grading) and a few events of its own ("begin", "start" of each grading, "stopped" by a
signal, "end"). Only that task writes that file, so concurrent tasks never share one; each
submission of an array is a run of its own (RUN = time, user, random suffix), so two instructors'
arrays, or two attempts of one, never share a journal either. Nothing else is written on the nodes.

The submitter waits with a progress bar fed by the journals and `squeue` (without slurmdbd,
`sacct` knows nothing; `scontrol show job` names a finished task's state while Slurm still holds
it), then merges every run's journals and writes the CSV with batch.write_csv. Failures lose
nothing: a task that is cancelled, runs past its `--time`, or dies with its node leaves the rows
it finished; the same command run again finds them and submits an array for the rest only. A
grading during which its task died twice without being sent a stop signal (killed for memory, a
node crash) is that submission's "crashed" row, not a third attempt: a submission cannot take
the array down with it. A grading past its deadline is its timeout row, as in a local batch.

Layout (STATE: --state-dir, default <csv>.slurm; on storage every node sees, like the course, the
venv and the submissions):

    STATE/runs/RUN/run.json             the run: array job id, options, all submissions, its share
    STATE/runs/RUN/job.sh               what each array task runs
    STATE/runs/RUN/journal/task-K.jsonl task K's journal
    STATE/runs/RUN/logs/                Slurm's output of each task
"""
from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from . import batch
from ..errors import EXIT_GRADER, EXIT_OK, EXIT_USAGE, Interrupted, describe, signal_exit_code, signal_zh, stop_on_signals

PER_TASK = 10                 # default share of one array task: its warm-up (torch import) is paid once per task
STRIKES = 2                   # deaths of a task during one grading that make it that submission's "crashed" row
SLURM_ONLY = ("partition", "time", "cpus_per_task", "mem", "gres", "sbatch_arg", "tasks", "max_running", "state_dir",
              "no_wait", "poll")
FINAL_ZH = {"CANCELLED": "被取消", "TIMEOUT": "到了时限（--time）", "NODE_FAIL": "节点故障", "FAILED": "失败",
            "OUT_OF_MEMORY": "内存超限（--mem）", "PREEMPTED": "被抢占", "BOOT_FAIL": "节点启动失败",
            "DEADLINE": "到了截止时间", "COMPLETED": "已结束"}


class SlurmError(Exception):
    """A user-facing failure of the Slurm mode (Chinese); `code`: the exit code."""

    def __init__(self, message: str, code: int = EXIT_GRADER):
        super().__init__(message)
        self.code = code


# -- the journals -----------------------------------------------------------------------------------

def _lines(path: Path) -> list[dict]:
    """The complete JSON lines of a journal (a torn last line, one being written, is skipped)."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    out = []
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def ident(run_id: str, item: dict) -> str:
    """What a row is found by: its key, or (a file that could not be read, whose key is None: never
    reused, as in the local batch) the run and the path."""
    return item["key"] or f"{run_id}:{item['path']}"


class Journals:
    """Every run's journals under STATE, read at once: `rows` (ident -> the latest row; a later run
    wins), `strikes` (ident -> deaths of a task during its grading with no stop signal), and per
    run and task the node, the last event and how many rows it wrote."""

    def __init__(self, state: Path, ended: set[str] = frozenset()):
        self.rows: dict[str, dict] = {}
        self.strikes: Counter = Counter()
        self.tasks: dict[str, dict[int, dict]] = {}
        for run_dir in sorted((state / "runs").glob("*/")):
            run_id = run_dir.name
            for f in sorted((run_dir / "journal").glob("task-*.jsonl")):
                m = re.fullmatch(r"task-(\d+)\.jsonl", f.name)
                if m:
                    self._read(run_id, int(m.group(1)), _lines(f), run_id in ended)

    def _read(self, run_id: str, task: int, lines: list[dict], ended: bool) -> None:
        info = self.tasks.setdefault(run_id, {}).setdefault(task, {"rows": 0, "last": None, "node": None})
        grading: set[str] = set()
        for d in lines:
            event = d.get("event")
            if event is None and "key" in d:
                row = {k: v for k, v in d.items() if k != "key"}
                found = d["key"] or f"{run_id}:{d.get('path')}"
                self.rows[found] = row
                grading.discard(found)
                info["rows"] += 1
                continue
            info["last"] = event
            if event == "begin":                 # a task that runs again (requeued) after dying mid-grading
                self.strikes.update(grading)
                grading = set()
                info["node"] = d.get("node")
            elif event == "start":
                grading.add(d.get("item"))
            elif event in ("stopped", "end", "refused"):
                grading = set()
                info["message"] = d.get("message")
        if ended:
            self.strikes.update(grading)

    def row(self, run_id: str, item: dict) -> dict | None:
        return self.rows.get(ident(run_id, item))


def missing(run_id: str, items: list[dict], journals: Journals) -> list[int]:
    """Indices of the items with no grade yet: no row, a grader error (retried, as in the local
    batch), or a file that could not be read (never reused), unless its grading killed its task
    STRIKES times."""
    out = []
    for i, item in enumerate(items):
        row = journals.row(run_id, item) if item["key"] else None
        if row is not None and row.get("category") != "grader_error":
            continue
        if item["key"] and journals.strikes[item["key"]] >= STRIKES:
            continue
        out.append(i)
    return out


def crashed_row(item: dict, backend: str, scale: str, strikes: int) -> dict:
    """The row of a submission during whose grading its array task died `strikes` times."""
    from ..exercises import get_exercise

    spec = get_exercise(item["exercise"])
    return {"student": item["student"], "exercise": item["exercise"], "path": item["path"], "passed": False, "score": 0,
            "max_score": spec.points, "target_ratio": spec.target_ratio, "category": "crashed", "backend": backend,
            "reason": f"进程异常退出：评分这份提交时，Slurm 数组任务 {strikes} 次意外结束（没有收到停止信号：被杀死、"
                      f"内存超限或节点故障），算作这份提交的错误，记 0 分"}


def final_rows(run: dict, journals: Journals) -> tuple[list[dict], list[int]]:
    """The CSV's rows in the command's order, and the indices of the submissions still without one."""
    rows, left = [], []
    for i, item in enumerate(run["items"]):
        row = journals.row(run["run"], item)
        if row is None and item["key"] and journals.strikes[item["key"]] >= STRIKES:
            row = crashed_row(item, run["backend"], run["scale"], journals.strikes[item["key"]])
        if row is None:
            left.append(i)
        else:
            rows.append(row | {"path": item["path"]})
    return rows, left


# -- the array task ---------------------------------------------------------------------------------

def share(run: dict, task: int) -> list[int]:
    """Task `task`'s items: every tasks-th of the run's todo list, starting at `task`."""
    return run["todo"][task::run["tasks"]]


def _event(journal: Path, **fields) -> None:
    """One fsynced line in this task's journal (O_APPEND: batch.py's rows go to the same file)."""
    line = (json.dumps({**fields, "time": round(time.time(), 3)}, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _node_problem(run: dict) -> str | None:
    """Why this node cannot grade, checked once before any grading (as the local batch does)."""
    from . import cgroup, policy, sandbox

    if run["sandbox"] == "require" and policy.bwrap_path() is None:
        return policy.NO_SANDBOX_REFUSAL
    if run["sandbox"] == "require" and not run.get("no_cgroup") and cgroup.available() is None:
        return cgroup.NO_CGROUP_REFUSAL
    try:
        sandbox.require_backend(run["backend"])
        sandbox.sweep_stale()
        sandbox.check_space()
    except sandbox.GraderProblem as e:
        return str(e)
    return None


def run_task(run_dir: Path, task: int | None = None) -> int:
    """One array task: grade this task's share into its journal. Exit 0 done, 4 this node cannot
    grade (the rows stay missing; the submitter says why), 128+N stopped by signal N."""
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")) if task is None else task
    mine = [run["items"][i] for i in share(run, task)]
    journal = run_dir / "journal" / f"task-{task}.jsonl"
    journal.parent.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname()
    _event(journal, event="begin", node=node, job=os.environ.get("SLURM_JOB_ID"), pid=os.getpid(), items=len(mine))
    if run.get("no_cgroup"):
        os.environ["VRAMLAB_CGROUP"] = "optional"
    problem = _node_problem(run)
    if problem:
        _event(journal, event="refused", message=problem)
        print(f"错误：节点 {node} 不能评分：{problem}", file=sys.stderr)
        return EXIT_GRADER

    def started(i: int) -> None:
        item = mine[i]
        _event(journal, event="start", item=ident(run["run"], item), path=item["path"])
        print(f"开始评分 {item['student']}/{item['exercise']}（{item['path']}）", file=sys.stderr, flush=True)

    try:
        rows = batch.grade_many([it["path"] for it in mine], workers=run["workers"], exercise=run["exercise"],
                                backend=run["backend"], scale=run["scale"], timeout_s=run["timeout_s"], progress=False,
                                sandbox=run["sandbox"], journal=journal, deadline_s=run["deadline_s"], on_start=started)
    except batch.Interrupted as e:
        _event(journal, event="stopped", signal=e.signum, done=len(e.rows))
        print(f"任务 {task} 已停止（{signal_zh(e.signum)}）：评完 {len(e.rows)}/{len(mine)} 份，都在 {journal}", file=sys.stderr)
        return signal_exit_code(e.signum)
    except batch.BatchError as e:
        _event(journal, event="refused", message=str(e))
        print(f"错误：{e}", file=sys.stderr)
        return EXIT_GRADER
    except Exception as e:          # noqa: BLE001 - the grader's failure, never the submissions' (no strike)
        _event(journal, event="refused", message=f"评分器出错：{describe(e)}")
        traceback.print_exc()
        return EXIT_GRADER
    _event(journal, event="end", done=len(rows))
    print(f"任务 {task} 完成：{len(rows)} 份", file=sys.stderr)
    return EXIT_OK


# -- Slurm's side -----------------------------------------------------------------------------------

def _slurm(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


def squeue(job_id: str) -> dict[int, dict] | None:
    """The array's tasks Slurm still lists (pending, running, completing): {task: {state, reason,
    node}}; {} once every task has ended; None when Slurm does not answer."""
    try:
        p = _slurm("squeue", "-h", "-r", "-j", str(job_id), "-o", "%K|%T|%r|%N")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return {} if "Invalid job id" in p.stderr else None
    out = {}
    for line in p.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0].isdigit():
            out[int(parts[0])] = {"state": parts[1], "reason": parts[2], "node": parts[3]}
    return out


def final_states(job_id: str) -> dict[int, str]:
    """A finished array's task states from `scontrol show job` (no slurmdbd needed), while Slurm
    still holds them (MinJobAge); {} after."""
    try:
        p = _slurm("scontrol", "-o", "show", "job", str(job_id))
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in p.stdout.splitlines() if p.returncode == 0 else ():
        task, state = re.search(r"\bArrayTaskId=(\d+)\b", line), re.search(r"\bJobState=(\S+)", line)
        if task and state:
            out[int(task.group(1))] = state.group(1)
    return out


def _log_state(run_dir: Path, task: int) -> str | None:
    """What slurmstepd wrote in the task's output when it ended it (time limit, cancel)."""
    text = ""
    for log in (run_dir / "logs").glob(f"*_{task}.out"):
        with contextlib.suppress(OSError):
            text += log.read_text(encoding="utf-8", errors="replace")
    if "DUE TO TIME LIMIT" in text:
        return "TIMEOUT"
    if "DUE TO NODE FAILURE" in text:
        return "NODE_FAIL"
    if "CANCELLED AT" in text:
        return "CANCELLED"
    return None


# -- the submitter ----------------------------------------------------------------------------------

def _runs(state: Path) -> list[dict]:
    out = []
    for f in sorted((state / "runs").glob("*/run.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(f.read_text(encoding="utf-8")))
    return out


def _active(state: Path) -> list[dict]:
    """Runs whose array Slurm still lists (or cannot tell about)."""
    return [r for r in _runs(state) if r.get("job_id") and squeue(r["job_id"]) != {}]


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(state: Path):
    """One submitter at a time per state folder: two would submit the same missing items twice."""
    import fcntl

    state.mkdir(parents=True, exist_ok=True)
    with open(state / ".submit.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SlurmError(f"另一个 vramlab grade-class 正在向 {state} 提交作业：等它提交完再运行", EXIT_USAGE) from None
        yield


def _sbatch_argv(args, run_dir: Path, tasks: int) -> list[str]:
    array = f"0-{tasks - 1}" + (f"%{args.max_running}" if args.max_running else "")
    argv = ["sbatch", "--parsable", f"--array={array}", "--job-name=vramlab-grade", f"--chdir={os.getcwd()}",
            f"--output={run_dir / 'logs' / '%A_%a.out'}", "--open-mode=append"]
    for option, value in (("partition", args.partition), ("time", args.time), ("cpus-per-task", args.cpus_per_task),
                          ("mem", args.mem), ("gres", args.gres)):
        if value:
            argv.append(f"--{option}={value}")
    return argv + list(args.sbatch_arg or []) + [str(run_dir / "job.sh")]


JOB_SH = """#!/bin/bash
# written by `vramlab grade-class --slurm` (vramlab/grader/slurm.py), run {run}
# Warm sandboxes end with the task: after the job nothing would reap a parked one.
export VRAMLAB_WARM_PARK_S=0
# torch threads follow the task's CPU allocation, not the node's core count (grader/threads.py)
if [ -n "${{SLURM_CPUS_PER_TASK:-}}" ]; then export VRAMLAB_GRADE_CORES=$SLURM_CPUS_PER_TASK; fi
exec {python} -m vramlab.grader.slurm task {run_dir}
"""


def _items(args, backend: str, scale: str) -> list[dict]:
    import glob

    paths = args.paths or sorted(glob.glob(os.path.join("nbgrader", "submitted", "*", "*", "*.ipynb")))
    if not paths:
        raise SlurmError("没有找到要评分的提交。", EXIT_USAGE)
    items = []
    for path in paths:
        job = batch.infer_job(path, args.exercise)
        items.append({"student": job[0], "exercise": job[1], "path": job[2], "key": batch.job_key(job, backend, scale)})
    return items


def submit(args, state: Path) -> dict | None:
    """Key the submissions, find what is missing in the journals and submit one array for it. The
    run (its run.json, with job_id), or None when every submission already has its grade."""
    backend = args.backend if args.backend != "auto" else ("cuda" if "gpu" in (args.gres or "") else "sim")
    scale = args.scale or ("gpu" if backend == "cuda" else "ci")
    if backend == "cuda" and not args.gres:
        print("注意：--backend cuda 却没有 --gres gpu:N：任务拿不到 GPU 时会拒绝评分（节点不能评分）", file=sys.stderr)
    items = _items(args, backend, scale)
    with _locked(state):
        for other in _active(state):
            if [ident(other["run"], it) for it in other["items"]] == [ident(other["run"], it) for it in items]:
                return other | {"_attached": True}          # the same command again while its array runs: wait for it
            raise SlurmError(f"运行 {other['run']}（作业 {other['job_id']}）还在集群上评这个班的另一组提交：等它结束"
                             f"（vramlab grade-class --attach {other['run']} --state-dir {state}）或 scancel {other['job_id']}，"
                             f"再提交新的", EXIT_USAGE)
        if args.fresh and (state / "runs").is_dir():
            old = state / f"runs.bak-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(state / "runs", old)
            print(f"--fresh：以前的成绩记录已改名为 {old}，全部重新评分", file=sys.stderr)
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{_user()}-{secrets.token_hex(3)}"
        journals = Journals(state, ended={r["run"] for r in _runs(state)})
        todo = missing(run_id, items, journals)
        run = {"run": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "user": _user(), "host": socket.gethostname(),
               "cwd": os.getcwd(), "csv": str(Path(args.csv).resolve()), "state": str(state.resolve()),
               "backend": backend, "scale": scale, "exercise": args.exercise, "timeout_s": args.timeout,
               "deadline_s": args.deadline, "sandbox": "off" if args.no_sandbox else "require",
               "no_cgroup": bool(args.no_cgroup), "workers": int(args.workers or 1), "items": items, "todo": todo,
               "tasks": 0, "job_id": None, "gradebook": args.gradebook}
        if not todo:
            return run
        tasks = min(len(todo), args.tasks or math.ceil(len(todo) / PER_TASK))
        run["tasks"] = tasks
        run_dir = state / "runs" / run_id
        (run_dir / "journal").mkdir(parents=True)
        (run_dir / "logs").mkdir()
        (run_dir / "job.sh").write_text(JOB_SH.format(run=run_id, python=shlex.quote(sys.executable),
                                                       run_dir=shlex.quote(str(run_dir.resolve()))), encoding="utf-8")
        (run_dir / "job.sh").chmod(0o755)
        run["sbatch"] = _sbatch_argv(args, run_dir.resolve(), tasks)
        _write_json(run_dir / "run.json", run)           # before sbatch: a task may start at once
        try:
            p = _slurm(*run["sbatch"])
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise SlurmError(f"无法运行 sbatch（{e}）：在能提交 Slurm 作业的登录节点上运行") from None
        if p.returncode != 0:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise SlurmError(f"sbatch 拒绝了这个作业数组，没有提交任何任务。Slurm 说：{p.stderr.strip()}")
        run["job_id"] = p.stdout.strip().split(";")[0]
        _write_json(run_dir / "run.json", run)
        return run


def _ended_with(state: Path, run_id: str) -> set[str]:
    """This run and the runs before it: none runs while a later one exists (submit() checks)."""
    return {r["run"] for r in _runs(state) if r["run"] <= run_id}


def _user() -> str:
    with contextlib.suppress(Exception):
        return re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser()) or "user"
    return "user"


def wait(run: dict, state: Path, poll: float, progress: bool = True) -> Journals:
    """Until every submission of the run has a row, or Slurm lists none of its tasks: a progress
    bar over the whole class, fed by the journals, with squeue's counts. The final journals."""
    run_id, todo = run["run"], run["todo"]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(run["items"]), initial=len(run["items"]) - len(todo), desc="评分", unit="份", file=sys.stderr)
    try:
        while True:
            queue = squeue(run["job_id"])
            journals = Journals(state, ended={run_id} if queue == {} else set())
            done = sum(1 for i in todo if journals.row(run_id, run["items"][i]) is not None)
            if bar is not None:
                bar.n = len(run["items"]) - len(todo) + done
                states = Counter(t["state"] for t in (queue or {}).values())
                bar.set_postfix_str("，".join(f"{n} 个{_STATE_ZH.get(s, s)}" for s, n in sorted(states.items()))
                                    if queue is not None else "squeue 暂时没有回答", refresh=False)
                bar.refresh()
            if done == len(todo) or queue == {}:
                return Journals(state, ended=_ended_with(state, run_id) if queue == {} else set())
            time.sleep(poll)
    finally:
        if bar is not None:
            bar.close()


_STATE_ZH = {"PENDING": "任务排队", "RUNNING": "任务在运行", "COMPLETING": "任务在收尾", "CONFIGURING": "任务在准备",
             "SUSPENDED": "任务暂停", "REQUEUED": "任务重新排队"}


def _task_report(run: dict, journals: Journals, state: Path) -> list[str]:
    """One line per task of the run that left submissions without a grade: why, when Slurm or the
    task's log can still tell."""
    run_dir = state / "runs" / run["run"]
    slurm = final_states(run["job_id"]) if run.get("job_id") else {}
    tasks = journals.tasks.get(run["run"], {})
    lines = []
    for task in range(run["tasks"]):
        ids = share(run, task)
        left = [i for i in ids if journals.row(run["run"], run["items"][i]) is None]
        if not left:
            continue
        info = tasks.get(task, {})
        why = slurm.get(task) or _log_state(run_dir, task)
        if info.get("last") == "refused":
            text = f"节点 {info.get('node')} 不能评分：{info.get('message')}"
        elif why:
            text = FINAL_ZH.get(why, why)
        elif not info:
            text = "没有开始（没有 journal）"
        else:
            text = "意外结束（没有收到停止信号）"
        lines.append(f"  任务 {task}（节点 {info.get('node') or '?'}）：{text}；评完 {len(ids) - len(left)}/{len(ids)} 份，"
                     f"日志 {run_dir / 'logs'}/{run['job_id']}_{task}.out")
    return lines


def finish(run: dict, journals: Journals, args, state: Path) -> int:
    """Write the CSV (and the rows on stdout, as the local batch does) and say what is left."""
    rows, left = final_rows(run, journals)
    csv_path = run["csv"]
    args.csv = csv_path
    batch._report(rows, args)
    print(f"已写入 {csv_path}（{len(rows)} 行）", file=sys.stderr)
    written = batch.write_gradebook(rows, args.gradebook or run.get("gradebook"))    # --gradebook now or at submit
    errors = sum(1 for r in rows if r.get("category") == "grader_error")
    crashed = sum(1 for r in rows if r.get("category") == "crashed" and "Slurm 数组任务" in (r.get("reason") or ""))
    if crashed:
        print(f"有 {crashed} 份提交在评分时让任务意外结束了 {STRIKES} 次：记为这份提交的错误（crashed，0 分）", file=sys.stderr)
    if left:
        print(f"还有 {len(left)} 份没有评完（CSV 里没有它们）：", file=sys.stderr)
        for line in _task_report(run, journals, state):
            print(line, file=sys.stderr)
        print("用同一条命令重新运行：只为这些提交再提交一个作业数组，已评完的不会重评。", file=sys.stderr)
        return EXIT_GRADER
    if errors:
        print(f"有 {errors} 份是评分器出错（不是学员的问题，没有给分）：原因见 reason 列；解决后用相同的命令重跑，只重评这几份。",
              file=sys.stderr)
        return EXIT_GRADER
    return EXIT_OK if written else EXIT_GRADER


def _state_for(args) -> Path:
    return Path(args.state_dir or (str(args.csv) + ".slurm"))


def _find_run(args) -> tuple[dict, Path]:
    """--attach RUN: a run id under the state folder, or the path of a run's folder."""
    candidates = [Path(args.attach), _state_for(args) / "runs" / args.attach]
    for folder in candidates:
        if (folder / "run.json").is_file():
            run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
            return run, Path(run["state"])
    runs = ", ".join(r["run"] for r in _runs(_state_for(args))[-5:]) or "没有"
    raise SlurmError(f"找不到运行 {args.attach}（在 {_state_for(args) / 'runs'} 下；最近的：{runs}）。"
                     f"用 --state-dir 或 --csv 指向提交时的位置，或直接给出运行的文件夹", EXIT_USAGE)


def slurm_main(args) -> int:
    if shutil.which("squeue") is None:          # without it the wait could never end
        raise SlurmError("找不到 squeue：请在能提交 Slurm 作业的登录节点上运行（或装好 Slurm 的客户端命令）")
    if args.gradebook is not None:              # checked before submitting, as the local batch does
        from . import gradebook
        try:
            args.gradebook = gradebook.locate(args.gradebook)
        except gradebook.GradebookError as e:
            raise SlurmError(f"{e}。没有提交作业。", EXIT_USAGE) from None
    if args.attach:
        run, state = _find_run(args)
        print(f"重新等待运行 {run['run']}（作业 {run.get('job_id')}，{run['tasks']} 个任务，{len(run['todo'])} 份）", file=sys.stderr)
    else:
        reason = batch.check_destination(args.csv)
        if reason:
            raise SlurmError(f"{reason}。没有提交作业；请换一个 --csv 路径。", EXIT_USAGE)
        if shutil.which("sbatch") is None:
            raise SlurmError("找不到 sbatch：请在能提交 Slurm 作业的登录节点上运行（或装好 Slurm 的客户端命令）")
        state = _state_for(args)
        run = submit(args, state)
        if run.pop("_attached", False):
            print(f"运行 {run['run']}（作业 {run['job_id']}）还在集群上：不再提交新的，改为等待它（同 --attach {run['run']}）",
                  file=sys.stderr)
        elif not run["todo"]:
            print(f"全部 {len(run['items'])} 份都已有成绩（{state}）：没有提交作业", file=sys.stderr)
            return finish(run, Journals(state, ended={r["run"] for r in _runs(state)}), args, state)
        else:
            reused = len(run["items"]) - len(run["todo"])
            print(f"已提交作业数组 {run['job_id']}：{run['tasks']} 个任务评 {len(run['todo'])} 份"
                  + (f"（另有 {reused} 份已有成绩，不再评）" if reused else "") + f"；运行编号 {run['run']}", file=sys.stderr)
            print(f"  journal 在 {state / 'runs' / run['run'] / 'journal'}，任务日志在 {state / 'runs' / run['run'] / 'logs'}",
                  file=sys.stderr)
            with contextlib.suppress(OSError):        # as the local batch: no old CSV that looks like this run's
                prev = batch._retire(args.csv)
                if prev:
                    print(f"上一次的 {args.csv} 已改名为 {prev}：这次的作业结束后写新的 CSV", file=sys.stderr)
        if args.no_wait:
            print(f"不等待（--no-wait）。之后用 vramlab grade-class --attach {run['run']} --state-dir {state} 等它并写 CSV"
                  f"{'和成绩库' if args.gradebook else ''}；"
                  f"取消用 scancel {run['job_id']}", file=sys.stderr)
            print(json.dumps({"run": run["run"], "job_id": run["job_id"], "tasks": run["tasks"],
                              "submissions": len(run["todo"])}) if args.json else run["run"])
            return EXIT_OK
    try:
        journals = wait(run, state, args.poll)
    except Interrupted as e:
        print(f"已停止等待（{signal_zh(e.signum)}）。作业数组 {run['job_id']} 还在集群上继续评分：用 vramlab grade-class "
              f"--attach {run['run']} --state-dir {state} 重新等待，或 scancel {run['job_id']} 取消。", file=sys.stderr)
        return e.exit_code
    return finish(run, journals, args, state)


# -- the command line -------------------------------------------------------------------------------

def build_parser():
    from ..args import positive_int, positive_seconds

    parser = batch.build_parser(prog="vramlab grade-class",
                                description="给一个班评分：默认在本机并行评分（同 python -m vramlab.grader.batch）；"
                                            "加 --slurm 在 Slurm 集群上用一个作业数组评分，结果写成同样的 CSV")
    g = parser.add_argument_group("Slurm 集群（--slurm）")
    g.add_argument("--slurm", action="store_true", help="提交一个 Slurm 作业数组评分，等它结束后写 CSV（默认 nbgrader/vramlab_grades.csv）")
    g.add_argument("--attach", metavar="RUN", help="重新等待以前提交的运行（运行编号或它的文件夹），结束后写 CSV")
    g.add_argument("--no-wait", action="store_true", help="提交后立即返回，打印运行编号（之后用 --attach 等它）")
    g.add_argument("--partition", help="分区（sbatch --partition）")
    g.add_argument("--time", help="每个数组任务的时限（sbatch --time，例如 01:00:00）")
    g.add_argument("--cpus-per-task", type=positive_int, help="每个任务的 CPU 核数（sbatch --cpus-per-task；评分的 torch 线程数随它）")
    g.add_argument("--mem", help="每个任务的内存（sbatch --mem，例如 32G）")
    g.add_argument("--gres", help="每个任务的通用资源，例如 gpu:1（sbatch --gres）；GPU 评分再加 --backend cuda")
    g.add_argument("--sbatch-arg", action="append", metavar="ARG",
                   help="原样传给 sbatch 的其他参数，可多次，例如 --sbatch-arg=--account=course42")
    g.add_argument("--tasks", type=positive_int, help=f"数组任务数（默认每 {PER_TASK} 份提交一个任务）；每个任务里同时评几份用 --workers（--slurm 时默认 1）")
    g.add_argument("--max-running", type=positive_int, help="同时运行的任务数上限（sbatch --array=...%%N）")
    g.add_argument("--state-dir", help="各任务的 journal、日志所在的文件夹，须在所有节点都能访问的共享存储上（默认：<CSV>.slurm）")
    g.add_argument("--poll", type=positive_seconds, default=5.0, help="等待时每隔几秒读一次 journal 和 squeue（默认 5）")
    return parser


def main(argv=None) -> int:
    """`vramlab grade-class`. Without --slurm or --attach: the local batch (batch.main). Exit codes as
    the batch's: 0 every submission graded, 2 bad arguments, 4 some rows are grader errors or
    some submissions are still without a grade (their tasks failed; the same command again grades
    them) or sbatch refused, 128+N the wait was stopped by signal N (the array goes on)."""
    from ..args import positive_int, report_error

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (args.slurm or args.attach):
        given = [f"--{name.replace('_', '-')}" for name in SLURM_ONLY
                 if getattr(args, name) not in (None, False, parser.get_default(name))]
        if given:
            parser.error(f"{'、'.join(given)} 只能和 --slurm 或 --attach 一起用")
        return batch.main(argv, parser=parser)
    if args.slurm and args.attach:
        parser.error("--slurm 和 --attach 不能同时使用：--attach 只等待已经提交的运行")
    if args.journal:
        parser.error("--slurm 模式下每个任务有自己的 journal（在 --state-dir 里），不能用 --journal")
    args.csv = args.csv or os.path.join("nbgrader", "vramlab_grades.csv")
    try:
        args.workers = positive_int(args.workers or "1")       # gradings at once in each task
    except argparse.ArgumentTypeError as e:
        parser.error(f"--workers {e}")
    with stop_on_signals():
        try:
            return slurm_main(args)
        except SlurmError as e:
            return report_error(str(e), e.code, args.json)
        except Interrupted as e:
            print(f"已中断（{signal_zh(e.signum)}）。", file=sys.stderr)
            return e.exit_code


def _task_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m vramlab.grader.slurm")
    p.add_argument("action", choices=("task",))
    p.add_argument("run_dir")
    p.add_argument("--task", type=int, default=None)
    a = p.parse_args(argv)
    return run_task(Path(a.run_dir), a.task)


if __name__ == "__main__":
    sys.exit(_task_main(sys.argv[1:]))
