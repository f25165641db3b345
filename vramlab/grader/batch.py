"""Grade many submissions on one machine, with bounded parallelism, a progress bar and a journal.

    python -m vramlab.grader.batch --workers 2 --csv nbgrader/vramlab_grades.csv nbgrader/submitted/*/*/*.ipynb

    from vramlab.grader.batch import grade_many
    rows = grade_many(["nbgrader/submitted/alice/ch07-checkpoint/ch07-checkpoint.ipynb"], workers=2)

Every submission goes through `vramlab.grader.grade_file` (the same isolated grader that
`vramlab.check()` and `vramlab grade` use) in a fixed-size process pool. A submission that cannot be
graded (broken file, grader error) becomes one row with score 0 and the reason; it never stops the
batch. The exercise id and the student id are read from nbgrader's layout
`.../<student>/<exercise>/<file>.ipynb` (or given with `--exercise`).

Durable and resumable: each finished grading is appended at once to a journal (one JSON line,
fsynced; `<csv>.journal.jsonl` by default). A rerun of the same command reuses the rows whose key
(exercise, student, the file's bytes, backend, scale) still matches, so only what is missing or
changed is graded again; `--fresh` starts over. Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the batch
cleanly: the workers and their gradings are killed, the CSV of what is done is written (atomically,
like at the end), and the exit code is 130, 143 or 129. An earlier CSV at the same path is renamed
`<csv>.prev` before grading starts, so that a batch killed outright (SIGKILL, power loss) leaves
no CSV that looks current; the journal still holds every finished row. The CSV's and journal's
folders, the temp disk's free space and the backend (a GPU for cuda) are checked before any
grading starts. Exit codes: vramlab/errors.py (0 done, 2 bad arguments, 4 some rows are grader
errors or the machine cannot grade, 128+N stopped by signal N).

Every grading has a wall-clock deadline (`--deadline`, $VRAMLAB_DEADLINE_S, default: the time
limit per case plus a margin; grader/deadline.py). A grading past it is that submission's
timeout (0 points, journaled and in the CSV like any row) and the batch goes on: inside the
worker a watchdog kills the grading's processes and interrupts it; should the worker itself not
answer, the parent kills that worker and everything below it, records the timeout and grades the
other submissions that the killed pool was running again in a fresh pool.

With `--gradebook [PATH]` the scores also go into nbgrader's gradebook once the CSV is written
(grader/gradebook.py: the auto_score of each exercise's graded cell; a manual score is kept).

For more than one machine: `vramlab grade-class --slurm` (grader/slurm.py) grades the class in one
Slurm job array with these same pieces; docs/guide/grading.md also shows a Kubernetes Indexed Job.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..args import ChineseArgumentParser, positive_int, positive_seconds, report_error
from ..errors import EXIT_GRADER, EXIT_OK, EXIT_USAGE, STOP_SIGNALS, describe, os_error_zh, signal_exit_code, signal_zh
from ..errors import Interrupted as Stopped, stop_on_signals

try:
    import fcntl
except ImportError:           # pragma: no cover - Windows: the journal is not locked
    fcntl = None

FIELDS = ["student", "exercise", "path", "passed", "score", "max_score", "ratio", "target_ratio", "peak_bytes",
          "baseline_peak_bytes", "correct", "category", "reason", "backend", "seconds"]
_OS_ERRORS_ZH = {errno.EACCES: "没有写权限", errno.EPERM: "没有权限", errno.EROFS: "文件系统是只读的",
                 errno.ENOSPC: "磁盘已满", errno.EEXIST: "路径上有同名的文件", errno.ENOTDIR: "路径上有同名的文件"}


def _os_reason(e: OSError) -> str:
    return _OS_ERRORS_ZH.get(e.errno) or os_error_zh(e, path=False)


class BatchError(Exception):
    """A user-facing failure before any grading (the message is Chinese)."""


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP stopped `grade_many`. `rows`: the finished rows in input order (reused ones
    included, all of them in the journal); `graded`: how many of those this run graded;
    `remaining`: how many submissions were not graded."""

    def __init__(self, signum: int, rows: list[dict], graded: int, remaining: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum, self.rows, self.graded, self.remaining = signum, rows, graded, remaining


def infer_job(path, exercise: str | None = None) -> tuple[str, str, str]:
    """(student, exercise, path) for a submission path in nbgrader's layout."""
    from ..exercises import EXERCISES

    p = Path(path)
    if exercise is None:
        for candidate in (p.parent.name, p.stem):
            if candidate in EXERCISES:
                exercise = candidate
                break
    student = p.parent.parent.name if p.parent.name == exercise else p.parent.name
    return student, exercise or "", str(p)


SUBMISSION_LIMIT = 256 * 2 ** 20      # a notebook larger than this is not read for its key


def job_key(job: tuple[str, str, str], backend: str, scale: str) -> str | None:
    """sha256 of what a grade depends on: exercise, student, the file's bytes, backend and scale.
    None for a file that cannot be read, or is not a regular file (a FIFO would block the batch:
    grader/safe_read.py): such a job is never reused."""
    from . import safe_read

    student, exercise, path = job
    try:
        data = safe_read.read(path, SUBMISSION_LIMIT, follow_symlinks=True)
    except OSError:
        return None
    h = hashlib.sha256(json.dumps([exercise, student, backend, scale]).encode())
    h.update(b"\n")
    h.update(data)
    return h.hexdigest()


def _grade_one(job: tuple[str, str, str], backend: str, scale: str, timeout_s, sandbox: str = "require",
               cores: int | None = None, deadline_s: float | None = None) -> dict:
    student, exercise, path = job
    row = {"student": student, "exercise": exercise, "path": path, "passed": False, "score": 0}
    t0 = time.perf_counter()
    try:
        if not exercise:
            raise ValueError(f"无法从路径判断练习编号：{path}（用 --exercise 指定）")
        from . import deadline, grade_file

        result = deadline.run(lambda: grade_file(exercise, path, backend=backend, scale=scale, timeout_s=timeout_s,
                                                 sandbox=sandbox, cores=cores),
                              exercise, backend, scale, timeout_s, deadline_s)
        row.update({k: result.get(k) for k in FIELDS if k in result and k not in ("student", "path")})
    except Exception as e:  # noqa: BLE001 - one broken submission never fails the batch
        row.update(category="grader_error", reason=describe(e))
    row.setdefault("seconds", round(time.perf_counter() - t0, 2))
    return row


def _timeout_row(job: tuple[str, str, str], backend: str, scale: str, limit: float, seconds: float) -> dict:
    """The row of a grading whose worker the parent killed at its deadline: that submission's timeout."""
    from . import deadline

    student, exercise, path = job
    row = {"student": student, "exercise": exercise, "path": path, "passed": False, "score": 0}
    try:
        result = deadline.timeout_result(exercise, backend, scale, limit, seconds)
        row.update({k: result.get(k) for k in FIELDS if k in result and k not in ("student", "path")})
    except KeyError:            # not an exercise of this course (cannot happen once grading started)
        row.update(category="timeout", reason=deadline.timeout_zh(limit), backend=backend, seconds=round(seconds, 2))
    return row


_announce = None          # in a pool worker: where it says which job it starts (see _graded)


def _graded(index: int, job, backend, scale, timeout_s, sandbox, cores, deadline_s) -> dict:
    """In a pool worker: tell the parent which job starts now (its deadline clock starts), then
    grade it. `deadline_s` is passed on only when given (`_grade_one` may be a test's fake)."""
    if _announce is not None:
        _announce.put((index, os.getpid()))
    extra = {"deadline_s": deadline_s} if deadline_s else {}
    return _grade_one(job, backend, scale, timeout_s, sandbox, cores, **extra)


def _kill_worker(pid: int) -> None:
    """SIGKILL a pool worker and every process below it (its gradings run in sessions of their
    own): stopped first, so that it starts nothing while its tree is listed."""
    from .observer import descendants

    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    for _ in range(5):
        below = descendants(pid)
        if not below:
            break
        for p in below:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _resolve_backend(backend: str) -> str:
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "sim"


# -- the journal: one JSON line per finished grading ------------------------------------------------

def _open_journal(path: Path, fresh: bool = False):
    """The journal opened for appending, and its rows by key. Locked, so that two batches never
    write one journal; a torn last line (a crash while writing it) is cut off."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if fresh and path.exists():
            os.replace(path, path.with_name(path.name + ".bak"))
        f = open(path, "a+b")
    except OSError as e:
        raise BatchError(f"无法打开 journal {path}（{_os_reason(e)}）") from None
    if fcntl is not None:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise BatchError(f"另一个评分进程正在写 {path}：等它结束，或用 --journal 换一个文件") from None
    f.seek(0)
    data = f.read()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        f.truncate(end)
    rows = {}
    for line in data[:end].splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("key"):
            rows[row["key"]] = row              # a later line for the same key wins
    _fsync_dir(path.parent)
    return f, rows


def _append(journal, key: str | None, row: dict) -> None:
    """On disk before the batch goes on: a crash loses at most the line being written."""
    journal.write((json.dumps({"key": key, **row}, ensure_ascii=False, default=str) + "\n").encode("utf-8"))
    journal.flush()
    os.fsync(journal.fileno())


def _fsync_dir(folder) -> None:
    """Make a new or renamed entry of `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- signals and the pool's workers ------------------------------------------------------------------

@contextlib.contextmanager
def _catch_signals():
    """While grading, SIGINT, SIGTERM and SIGHUP only note themselves: the loop stops at a clean
    point. A signal this process ignores (`nohup`: SIGHUP) stays ignored."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():   # handlers are the main thread's
        yield caught
        return
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in STOP_SIGNALS
           if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield caught
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _signals_blocked():
    """Processes started in here inherit the blocked mask: a worker unblocks once its handlers are
    set, so a Ctrl-C while it imports prints no KeyboardInterrupt traceback."""
    if not hasattr(signal, "pthread_sigmask"):        # pragma: no cover - Windows
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _worker_init(parent_pid: int, stop, tmp: str, announce=None) -> None:
    """In each pool worker. Its gradings' temp folders go under the batch's folder, which the parent
    removes. Ctrl-C (the terminal sends it to the whole process group) is the parent's to handle;
    SIGTERM ends the worker and what it started. A thread watches `stop`, the read end of a pipe
    whose write end only the parent holds: it reads EOF when the parent closes it or is gone."""
    global _announce
    tempfile.tempdir, _announce = tmp, announce
    signal.signal(signal.SIGINT, lambda signum, frame: None)   # not SIG_IGN: the gradings' children would inherit it
    if hasattr(signal, "SIGHUP"):                               # a hang-up reaches the whole group too
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, lambda signum, frame: _end_worker(parent_pid, tmp))
    # started while the signals are still blocked (see _signals_blocked), the thread keeps them
    # blocked: they go to the main thread, which runs the handlers
    threading.Thread(target=_watch, args=(parent_pid, stop, tmp), daemon=True).start()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _watch(parent_pid: int, stop, tmp: str) -> None:
    while not stop.poll(0.5) and os.getppid() == parent_pid:     # getppid: in case the pipe was inherited
        pass
    # End in the main thread: it is the one that starts the gradings' processes, so none starts
    # after the kill; the signal interrupts whatever it waits for.
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        time.sleep(2)                       # a main thread stuck in C code: end from here
    _end_worker(parent_pid, tmp)


def _end_worker(parent_pid: int, tmp: str) -> None:
    _kill_children()
    if os.getppid() != parent_pid:          # a SIGKILLed parent cannot remove the folder any more
        shutil.rmtree(tmp, ignore_errors=True)
    os._exit(1)


def _kill_children() -> None:
    """SIGKILL this process's children: the grader starts each in its own session, out of reach of
    the terminal's Ctrl-C and of the end of this worker."""
    me = os.getpid()
    for stat in glob.glob("/proc/[0-9]*/stat"):         # Linux; elsewhere nothing to scan
        try:
            with open(stat, "rb") as f:
                ppid, pgrp = f.read().rsplit(b")", 1)[1].split()[1:3]
            if int(ppid) == me:
                pid = int(stat.split("/")[2])
                os.killpg(pid, signal.SIGKILL) if int(pgrp) == pid else os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue


class _Pool(ProcessPoolExecutor):
    """The batch's process pool; `announce`: the queue its workers say which job they start on."""

    announce = None


def start_pool(workers: int):
    """A pool of spawned workers (no fork of a process that may hold CUDA or threads), the pipe
    that stops them (see _worker_init), the folder for their gradings' temp files and the queue on
    which they say which job they start (see _graded). Not a multiprocessing.Event: setting one
    waits for every process that waited on it, dead or not."""
    ctx = multiprocessing.get_context("spawn")
    if os.name == "posix":
        from multiprocessing import resource_tracker

        with _signals_blocked():    # it keeps this mask: SIGHUP sent to the group (a terminal hang-up) spares it
            resource_tracker.ensure_running()
    stop_r, stop_w = ctx.Pipe(duplex=False)
    tmp = tempfile.mkdtemp(prefix="vramlab-batch-")
    from .sandbox import mark_owner
    mark_owner(tmp)                 # a later grading removes it if this batch is SIGKILLed (sandbox.sweep_stale)
    announce = ctx.SimpleQueue()
    pool = _Pool(max_workers=max(1, int(workers)), mp_context=ctx, initializer=_worker_init,
                 initargs=(os.getpid(), stop_r, tmp, announce))
    pool.announce = announce
    return pool, (stop_r, stop_w), tmp


def stop_pool(pool: ProcessPoolExecutor, stop, tmp: str, kill: bool) -> None:
    """Shut the pool down; with `kill`, end its workers now instead of letting them finish. The
    pending futures are not cancelled first: the pool fails them itself once its workers are gone
    (Python 3.11's pool would trip over a cancelled one there)."""
    if kill:
        procs = list((pool._processes or {}).values())     # no public way to reach them before Python 3.14
        stop[1].close()                                 # see _worker_init
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    pool.shutdown(wait=True)
    for end in stop:
        end.close()
    shutil.rmtree(tmp, ignore_errors=True)


# -- the batch -----------------------------------------------------------------------------------------

def _result(fut, job: tuple[str, str, str]) -> dict:
    try:
        return fut.result()
    except Exception as e:  # noqa: BLE001 - a worker that died (e.g. killed) is one failed row
        student, ex, path = job
        return {"student": student, "exercise": ex, "path": path, "passed": False, "score": 0,
                "category": "grader_error", "reason": describe(e)}


def _progress_bar(total: int, done: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:          # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, initial=done, desc="评分", unit="份", file=sys.stderr)


def _summary(graded: list[dict], reused: int, wall_s: float) -> str:
    """This run's numbers: gradings done now, reused, wall time, median latency, throughput."""
    text = f"本次评分 {len(graded)} 份，复用已有成绩 {reused} 份，用时 {wall_s:.1f} 秒"
    seconds = [r["seconds"] for r in graded if isinstance(r.get("seconds"), (int, float))]
    if seconds:
        text += f"；单份评分耗时中位数 {statistics.median(seconds):.1f} 秒"
    if graded and wall_s > 0:
        text += f"，全班吞吐 {len(graded) / wall_s * 60:.1f} 份/分钟"
    return text


def grade_many(paths, workers: int = 2, exercise: str | None = None, backend: str = "sim", scale: str | None = None,
               timeout_s: float | None = None, progress: bool = True, sandbox: str = "require",
               journal=None, fresh: bool = False, executor=None, started=None, deadline_s: float | None = None,
               on_start=None) -> list[dict]:
    """Grade `paths` (submission files) with at most `workers` submissions at a time; returns one
    row per path, in the order given. Each worker keeps warm sandboxes (grader/slots.py) and the
    starter's run is measured once per exercise and kept (grader/baselines.py), so a grading is
    one sandboxed child forked from a warm worker; `workers` = 1 per GPU, or the number of cores
    on the simulated device.
    `backend="sim"` with the ci scale is what `vramlab.check()` in the notebook uses. Learner code
    runs in the OS sandbox: without bubblewrap the batch refuses to start (`sandbox="off"` to
    override, only for submissions you trust).

    `journal` (a path): every finished row is appended there at once, and rows already there whose
    key still matches are reused instead of graded again (not those of a grader error); `fresh=True`
    renames an existing journal to `.bak` first. `started()` is called once the journal is held,
    before any grading. SIGINT, SIGTERM or SIGHUP (main thread only) raise `Interrupted` after the
    pool is killed. `deadline_s`: each grading's wall-clock deadline (default: grader/deadline.py's);
    past it the submission is a timeout row. `on_start(i)`: called in this process when a pool
    worker starts grading `paths[i]` (grader/slurm.py journals it). `executor`: run the gradings in this
    `concurrent.futures.Executor` instead of a pool of spawned processes (tests use threads, which
    see a monkeypatched `_grade_one`); it is not shut down here, and its workers are not killed at
    a deadline (the watchdog inside each grading still is)."""
    from . import policy
    from .core import usable_cores

    if sandbox == "require" and policy.bwrap_path() is None:
        raise SystemExit(policy.NO_SANDBOX_REFUSAL)
    backend = _resolve_backend(backend)
    scale = scale or ("gpu" if backend == "cuda" else "ci")
    jobs = [infer_job(p, exercise) for p in paths]
    keys = [job_key(job, backend, scale) for job in jobs]
    rows: list[dict | None] = [None] * len(jobs)
    log, known = _open_journal(Path(journal), fresh) if journal else (None, {})
    if started is not None:
        try:
            started()
        except BaseException:
            if log is not None:
                log.close()
            raise
    for i, key in enumerate(keys):
        old = known.get(key) if key else None
        if old is not None and old.get("category") != "grader_error":    # a grader failure is retried
            rows[i] = {k: v for k, v in old.items() if k != "key"} | {"path": jobs[i][2]}
    todo = [i for i, r in enumerate(rows) if r is None]
    share = max(1, usable_cores() // max(1, int(workers)))     # torch threads: each grading its share of the cores
    reused = len(jobs) - len(todo)
    if progress and reused:
        print(f"已有 {reused} 份成绩（{journal}），跳过；还要评 {len(todo)} 份", file=sys.stderr)
    bar = _progress_bar(len(jobs), reused) if progress else None
    t0 = time.perf_counter()
    from . import deadline as grading_deadline

    # the parent's own limit: a worker whose grading outlives its deadline by this much is killed
    hard = {i: grading_deadline.seconds(jobs[i][1], scale, timeout_s, deadline_s) + 3 * grading_deadline.GRACE_S
            for i in todo}

    def record(i: int, r: dict) -> None:
        rows[i] = r
        if log is not None:
            _append(log, keys[i], r)
        if bar is not None:
            bar.set_postfix_str(f"{r['student']}/{r['exercise']}: {r.get('score', 0)} 分")
            bar.update(1)

    pending: set = set()
    pool = stop = tmp = None
    with _catch_signals() as caught:
        try:
            queue = list(todo)
            while queue and not caught:     # a second round only after a worker was killed at a deadline
                if executor is None:
                    pool, stop, tmp = start_pool(workers)
                with _signals_blocked():                    # the workers start here (see _signals_blocked)
                    futures = {(executor or pool).submit(_graded, i, jobs[i], backend, scale, timeout_s, sandbox, share,
                                                         deadline_s): i for i in queue}
                pending, queue = set(futures), []
                running: dict[int, tuple[int, float]] = {}        # job -> (its worker's pid, when it started)
                killed: dict[int, float] = {}                      # job -> seconds it ran when its worker was killed
                while pending and not caught:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    # drained for a pool passed in too (bench.py passes one of start_pool's): a full pipe would block its workers
                    announce = getattr(executor or pool, "announce", None)
                    while announce is not None and not announce.empty():
                        i, pid = announce.get()
                        running[i] = (pid, time.monotonic())
                        if on_start is not None:
                            on_start(i)
                    for fut in sorted(done, key=futures.get):       # the same order every time
                        if caught and fut.exception() is not None:
                            continue                # its worker got the same signal (sent to the group): no result
                        i = futures[fut]
                        if i in killed and fut.exception() is not None:
                            record(i, _timeout_row(jobs[i], backend, scale, hard[i] - 3 * grading_deadline.GRACE_S,
                                                   killed[i]))
                        elif killed and isinstance(fut.exception(), BrokenProcessPool):
                            queue.append(i)         # killed with the pool, not for its own doing: graded again
                        else:
                            record(i, _result(fut, jobs[i]))
                    now = time.monotonic()
                    for i, (pid, since) in running.items() if executor is None else ():    # not a pool we did not make
                        if rows[i] is None and i not in killed and now - since > hard[i]:
                            _kill_worker(pid)       # the pool breaks: its other jobs come back as BrokenProcessPool
                            killed[i] = now - since
                if executor is None:
                    stop_pool(pool, stop, tmp, kill=bool(pending or killed))
                    pool = None
                queue.sort()
        finally:
            if executor is None and pool is not None:
                stop_pool(pool, stop, tmp, kill=True)
            elif executor is not None:
                for fut in pending:
                    fut.cancel()
            if log is not None:
                log.close()
            if bar is not None:
                bar.close()
    graded = [rows[i] for i in todo if rows[i] is not None]
    if progress:
        print(_summary(graded, reused, time.perf_counter() - t0), file=sys.stderr)
    finished = [r for r in rows if r is not None]
    if caught and len(finished) < len(jobs):
        raise Interrupted(caught[0], finished, len(graded), len(jobs) - len(finished))
    return finished


def check_destination(path) -> str | None:
    """Why `path` cannot be written (its folder is created here if missing), or None if it can."""
    p = Path(path)
    if p.is_dir():
        return f"{p} 是一个文件夹，不能写成文件"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p.parent):
            pass
        if p.exists():
            with open(p, "ab"):
                pass
    except OSError as e:
        return f"无法写入 {p}（{_os_reason(e)}）"
    return None


def _retire(csv_path) -> str | None:
    """Rename an earlier CSV at `csv_path` to `<csv>.prev` (atomically): until this batch writes
    its own, no CSV at that path looks like this batch's result. The new name, if one was made."""
    p = Path(csv_path)
    if not p.is_file():
        return None
    prev = p.with_name(p.name + ".prev")
    os.replace(p, prev)
    _fsync_dir(p.parent)
    return str(prev)


def write_csv(rows, path) -> None:
    """Atomically: a temp file in the same folder, then os.replace. A reader, or a crash, sees the
    old CSV or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _report(rows, args) -> None:
    """The CSV (if asked) and one line per row on stdout."""
    if args.csv:
        write_csv(rows, args.csv)
    for r in rows:
        if args.json:
            print(json.dumps(r, ensure_ascii=False))
        else:
            mark = "通过" if r.get("passed") else "未通过"
            print(f"{r['student']}\t{r['exercise']}\t{r.get('score', 0)}/{r.get('max_score', '?')}\t{mark}\t{r.get('reason', '')}")


def build_parser(prog: str = "python -m vramlab.grader.batch",
                 description: str = "并行评分多份提交（进程池 + 进度条 + 可续评的 journal）") -> ChineseArgumentParser:
    """The batch's options; `vramlab grade-class` (grader/slurm.py) adds its Slurm options to them."""
    parser = ChineseArgumentParser(prog=prog, description=description)
    parser.add_argument("paths", nargs="*", help="提交的文件；默认 nbgrader/submitted/*/*/*.ipynb")
    parser.add_argument("--workers", help="同时评分的份数（默认取环境变量 WORKERS，否则 2）")
    parser.add_argument("--exercise", help="练习编号（默认从路径 <学号>/<编号>/ 推断）")
    parser.add_argument("--backend", choices=("sim", "cuda", "auto"), default="sim",
                        help="sim（默认，与 notebook 里的 check() 相同）、cuda，或 auto（有 GPU 就用 cuda）")
    parser.add_argument("--scale", choices=("ci", "gpu"), default=None, help="默认：cuda 用 gpu，sim 用 ci")
    parser.add_argument("--timeout", type=positive_seconds, default=None, help="每份提交的超时（秒，大于 0）")
    parser.add_argument("--deadline", type=positive_seconds, default=None,
                        help="每份评分的总时限（秒，大于 0；含准备、起始代码和隐藏用例）。默认取环境变量 VRAMLAB_DEADLINE_S，"
                             "否则为每个用例的运行时限之和再加 300 秒余量；超过的记为这份提交超时（0 分），批量评分继续")
    parser.add_argument("--csv", help="把结果写成 CSV（整体替换，不会只写一半；已有的旧 CSV 先改名为 .prev）")
    parser.add_argument("--gradebook", nargs="?", const=True, metavar="PATH",
                        help="CSV 写完后把分数也写进 nbgrader 的成绩库：每份提交记为评分单元格 <编号>-check 的自动分"
                             "（auto_score），教师填过的人工分不动，重跑结果相同。PATH：成绩库文件或数据库网址；只写 --gradebook 时用"
                             " nbgrader/gradebook.db（本课程 nbgrader_config.py 的位置），没有就用 gradebook.db（nbgrader 的默认位置）。"
                             "成绩库里没有的学号或作业跳过，并在最后说明原因")
    parser.add_argument("--journal", help="每评完一份就追加一行的记录文件（默认：<CSV>.journal.jsonl）；重跑时复用其中的成绩")
    parser.add_argument("--fresh", action="store_true", help="不复用 journal 里的成绩，从头评分（旧 journal 改名为 .bak）")
    parser.add_argument("--json", action="store_true", help="每份提交输出一行 JSON")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="没有 bubblewrap 时也评分（学员代码不在操作系统沙箱里：只在信任提交者时使用）")
    parser.add_argument("--no-cgroup", action="store_true",
                        help="不能创建内存 cgroup 时也评分（只用进程的常驻内存对照：藏在内存文件、管道里的内存查不出来）")
    return parser


def main(argv=None, parser=None) -> int:
    """The command line. Exit codes (vramlab/errors.py): 0 every row graded, 2 bad arguments or an
    unwritable destination, 4 some rows are grader errors (a rerun retries them), a database error
    left scores out of the gradebook (--gradebook; a rerun writes them) or this machine cannot
    grade (no sandbox, no GPU, a full temp disk), 128+N stopped by signal N. With --json,
    a failure before grading is one JSON error object on stdout. `parser`: build_parser()'s, or
    one with more options (which this function ignores)."""
    parser = parser or build_parser()
    with stop_on_signals():
        try:
            return _main(parser, parser.parse_args(argv))
        except Stopped as e:          # outside the grading itself (which stops with Interrupted)
            print(f"已中断（{signal_zh(e.signum)}），还没有开始评分或结果已经写完。", file=sys.stderr)
            return e.exit_code


def _main(parser, args) -> int:
    def fail(message: str, code: int) -> int:
        return report_error(message, code, args.json)

    try:
        workers = positive_int(args.workers or os.environ.get("WORKERS", "2"))
    except argparse.ArgumentTypeError as e:
        parser.error(f"{'--workers' if args.workers else '环境变量 WORKERS'} {e}")
    from . import deadline as grading_deadline

    try:
        grading_deadline.from_env()
    except ValueError as e:
        return fail(f"{e}。还没有开始评分。", EXIT_USAGE)
    if args.exercise is not None:
        from ..exercises import EXERCISES
        if args.exercise not in EXERCISES:
            return fail(f"未知练习 {args.exercise!r}；可选：{'、'.join(EXERCISES)}", EXIT_USAGE)
    paths = args.paths or sorted(glob.glob(os.path.join("nbgrader", "submitted", "*", "*", "*.ipynb")))
    if not paths:
        return fail("没有找到要评分的提交。", EXIT_USAGE)
    journal = args.journal or (args.csv + ".journal.jsonl" if args.csv else None)
    for dest in (args.csv, journal):
        reason = dest and check_destination(dest)
        if reason:
            return fail(f"{reason}。还没有开始评分；请换一个 --csv / --journal 路径。", EXIT_USAGE)
    if args.gradebook is not None:            # checked now, not after grading the class
        from . import gradebook
        try:
            args.gradebook = gradebook.locate(args.gradebook)
        except gradebook.GradebookError as e:
            return fail(f"{e}。还没有开始评分。", EXIT_USAGE)
    from . import policy, sandbox

    if not args.no_sandbox and policy.bwrap_path() is None:
        return fail(policy.NO_SANDBOX_REFUSAL, EXIT_GRADER)
    from . import cgroup
    if args.no_cgroup:
        os.environ["VRAMLAB_CGROUP"] = "optional"          # the graders this batch starts inherit it
    elif not args.no_sandbox and cgroup.available() is None:
        return fail(cgroup.NO_CGROUP_REFUSAL, EXIT_GRADER)
    try:
        sandbox.require_backend(_resolve_backend(args.backend))       # once, before any worker starts
        sandbox.sweep_stale()               # folders of gradings whose process was killed
        sandbox.check_space()
    except sandbox.GraderProblem as e:
        return fail(f"{e}。还没有开始评分。", EXIT_GRADER)
    resume = f"用相同的命令重新运行会从这里继续（{journal}）。" if journal else "没有 journal（--csv 或 --journal），重新运行会从头评分。"
    retired: list[str] = []

    def started() -> None:               # the journal is ours now: no other batch writes this CSV
        if args.csv:
            prev = _retire(args.csv)
            if prev:
                retired.append(prev)
                print(f"上一次的 {args.csv} 已改名为 {prev}：本次评分结束（或中断）时写新的 CSV", file=sys.stderr)

    try:
        rows = grade_many(paths, workers=workers, exercise=args.exercise, backend=args.backend, scale=args.scale,
                          timeout_s=args.timeout, sandbox="off" if args.no_sandbox else "require",
                          journal=journal, fresh=args.fresh, started=started, deadline_s=args.deadline)
    except BatchError as e:
        return fail(str(e), EXIT_USAGE)
    except OSError as e:              # renaming the old CSV
        return fail(f"无法改名旧的 CSV：{os_error_zh(e)}。还没有开始评分。", EXIT_USAGE)
    except Interrupted as e:
        saved = ""
        try:
            _report(e.rows, args)
            if args.csv:
                saved = f"已完成的 {len(e.rows)} 份成绩已写入 {args.csv}（不完整：缺 {e.remaining} 份）。"
        except Stopped:
            saved = f"已完成的成绩都在 {journal} 里（CSV 没有写完）。" if journal else ""
        except OSError as err:
            saved = f"CSV 没有写成（{os_error_zh(err)}），已完成的成绩都在 {journal} 里。"
        print(f"已中断（{signal_zh(e.signum)}）：本次评了 {e.graded} 份，共完成 {len(e.rows)}/{len(paths)} 份，"
              f"还剩 {e.remaining} 份没评。{saved}{resume}", file=sys.stderr)
        return signal_exit_code(e.signum)
    try:
        _report(rows, args)
    except Stopped as e:
        print(f"已中断（{signal_zh(e.signum)}）：成绩都已评完并在 {journal or '内存'} 里，CSV 可能没有写完。{resume}",
              file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"错误：无法写入 CSV {os_error_zh(e)}。成绩都在 {journal} 里：换一个 --csv 重新运行即可（不会重新评分）。",
              file=sys.stderr)
        return EXIT_GRADER
    if args.csv:
        print(f"已写入 {args.csv}（{len(rows)} 行）", file=sys.stderr)
    written = write_gradebook(rows, args.gradebook)
    errors = sum(1 for r in rows if r.get("category") == "grader_error")
    if errors:
        print(f"有 {errors} 份是评分器出错（不是学员的问题，没有给分）：原因见 reason 列；解决后用相同的命令重跑，只重评这几份。",
              file=sys.stderr)
        return EXIT_GRADER
    return EXIT_OK if written else EXIT_GRADER


def write_gradebook(rows, db_url: str | None) -> bool:
    """After the CSV: the scores into nbgrader's gradebook (grader/gradebook.py), if asked, and its
    summary on stderr. False when a database error left some unwritten (a rerun writes them)."""
    if not db_url:
        return True
    from . import gradebook

    summary = gradebook.write(rows, db_url)
    print(summary.zh(), file=sys.stderr)
    return summary.error is None


if __name__ == "__main__":
    sys.exit(main())
