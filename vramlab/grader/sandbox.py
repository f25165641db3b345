"""Run one grading job (every rank of it) in the OS sandbox and observe it from outside.

`run_job(job, source, ...)` makes the grading's folder (the submission's code and the job file, the
only place the learner can write), starts `launch.py` under bubblewrap (policy.py) with resource
limits, and speaks a small protocol with each rank over its own pair of pipes:

    rank -> parent  {"event": "ready", "pid": ..., "allocated": ...}   before any learner code
    parent          reads /proc of that process, resets its high-water mark   (observer.py)
    parent -> rank  "go"
    rank -> parent  {"event": "done"}                                     result file written
    parent          reads the high-water mark and written bytes, stops the process (SIGSTOP)

When every rank is done (or one fails, or time runs out) the whole sandbox is killed; only then
are the result files read. They are the learner's claims: sandbox.py checks their shape, core.py
and the kind's judge decide what they are worth.

Faults of the grading machine are not the learner's (`GraderProblem`, a Chinese message, never a
score): the temp disk is checked for free space before a run, and a result that is missing or
unreadable while that disk is (nearly) full, or a write that failed for want of space, is a full
disk, not a forged or crashed submission. Every run is tracked until its processes are killed and
its folder removed: `abort_all()` ends them at once (a stop signal, see vramlab/errors.py), and
each grading folder names its owner process, so that a folder left by a process that was killed
(SIGKILL, power loss) is removed by the next grading on this machine (`sweep_stale`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import cgroup, observer, policy, slots
from .job import Job
from ..units import MiB, fmt_bytes

OUTPUT_LIMIT = 64 * MiB
RANK_GRACE_S = 20.0        # how long the other ranks may take to say done after the first one did
RESULT_LIMIT = 8 * MiB
# free space the temp disk must have before a run: a learner may write OUTPUT_LIMIT to stdout alone
MIN_FREE_BYTES = int(float(os.environ.get("VRAMLAB_MIN_FREE_MIB", "64") or 0) * MiB)
TEMP_PREFIXES = ("vramlab-grade-", "vramlab-slot-", "vramlab-batch-", "vramlab-autograde-")
OWNER_FILE = "owner"
STALE_AGE_S = 60.0          # a younger folder may be between its creation and its owner's record
UNOWNED_AGE_S = 86400.0     # a folder without an owner record (an older vramlab's): only after a day


class GraderProblem(RuntimeError):
    """This machine cannot grade now (a full temp disk, no GPU for a cuda grading): never the
    learner's fault. The message (Chinese) says what to do; core.py reports it as a GraderError."""


def _free_bytes(folder) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full_zh(folder, free: int | None) -> str:
    left = f"只剩 {fmt_bytes(free)} 可用" if free is not None else "空间不足"
    return (f"评分用的临时磁盘（{folder}）{left}，评分需要至少 {fmt_bytes(max(MIN_FREE_BYTES, RESULT_LIMIT))}："
            "这不是提交的问题，没有给分。请清理磁盘，或把 TMPDIR 指到空间足够的文件夹，然后重新评分")


def check_space(folder=None) -> None:
    """Refuse to start a run on a temp disk with less than MIN_FREE_BYTES free."""
    folder = folder or tempfile.gettempdir()
    free = _free_bytes(folder)
    if free is not None and free < MIN_FREE_BYTES:
        raise GraderProblem(disk_full_zh(folder, free))


_cuda_available: bool | None = None


def require_backend(backend: str) -> None:
    """Refuse a cuda grading on a machine without a usable GPU, before any child starts."""
    global _cuda_available
    if backend != "cuda":
        return
    if _cuda_available is None:
        import torch

        _cuda_available = bool(torch.cuda.is_available())
    if not _cuda_available:
        raise GraderProblem("这台机器上没有可用的 GPU（torch.cuda.is_available() 为 False）：--backend cuda 需要 NVIDIA GPU "
                            "和 CUDA 版的 PyTorch。没有 GPU 时用 --backend sim（默认，与 notebook 里的 check() 相同）")


# -- the runs in flight, and the folders of runs whose process was killed --------------------------

_active: dict[int, object] = {}
_active_lock = threading.Lock()
_swept = False


@contextlib.contextmanager
def _tracked(kill):
    """While the block runs, `abort_all` may call `kill` to end this run's processes."""
    token = object()
    with _active_lock:
        _active[id(token)] = kill
    try:
        yield
    finally:
        with _active_lock:
            _active.pop(id(token), None)


def active_runs() -> int:
    with _active_lock:
        return len(_active)


def abort_all(wait_s: float = 20.0) -> int:
    """Kill the processes of every run in flight in this process (a stop signal arrived) and wait
    until their runs have cleaned up (processes reaped, folders removed); how many were killed."""
    with _active_lock:
        kills = list(_active.values())
    for kill in kills:
        try:
            kill()
        except Exception:  # noqa: BLE001 - killing what may already be gone
            pass
    deadline = time.monotonic() + wait_s
    while active_runs() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(kills)


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every process below it (a sandbox's pid 1 is in a
    session of its own: bwrap --new-session)."""
    for target in [pid, *observer.descendants(pid)]:
        for send in (os.killpg, os.kill):
            try:
                send(target, signal.SIGKILL)
            except OSError:
                pass


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def mark_owner(folder, pid: int | None = None) -> None:
    """Record in `folder` the process whose life it belongs to (pid and start time)."""
    pid = pid or os.getpid()
    try:
        (Path(folder) / OWNER_FILE).write_text(f"{pid} {_start_time(pid)}\n", encoding="ascii")
    except OSError:
        pass


def _owner_alive(folder: Path) -> bool | None:
    """Whether the process named in `folder`'s owner record still runs; None without a record."""
    try:
        pid, start = (folder / OWNER_FILE).read_text(encoding="ascii").split()
        return _start_time(int(pid)) == start
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return False


def sweep_stale(folder=None) -> list[str]:
    """Remove this user's grading folders (they hold learners' code) whose owner process is gone,
    left by a grading, a warm sandbox, a batch or an autograde that was killed; their paths."""
    folder = Path(folder or tempfile.gettempdir())
    removed, now = [], time.time()
    if _start_time(os.getpid()) is None:         # no /proc (not Linux): owners cannot be checked
        return removed
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.name.startswith(TEMP_PREFIXES) or not entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                continue
            alive, age = _owner_alive(Path(entry.path)), now - st.st_mtime
            if alive or age < STALE_AGE_S or (alive is None and age < UNOWNED_AGE_S):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, onerror=_unlock_and_retry)
        removed.append(entry.path)
    return removed


def _unlock_and_retry(func, path, exc):
    """The learner may have made a folder unreadable: it is ours, make it writable and retry."""
    try:
        slots._unlock(func, path, exc)
    except OSError:
        pass


def _sweep_once() -> None:
    global _swept
    if not _swept:
        _swept = True
        sweep_stale()
        cgroup.sweep_stale()


@dataclass
class ChildRun:
    payload: dict | None                  # merged over ranks; the learner's claims
    returncode: int | None
    timed_out: bool
    seconds: float
    stderr_tail: str
    protocol_error: str | None = None     # the process broke the ready/done protocol (Chinese)
    observations: list = field(default_factory=list)
    rank_peaks: list = field(default_factory=list)
    sandboxed: bool = True
    cpu_seconds: float | None = None      # the ranks' CPU time, where the warm worker reports it


def _limits(memory: int, cpu_seconds: int):
    die = _parent_death_signal()

    def child() -> None:
        die()                # the grader SIGKILLed: its child does not grade on, parented to init
        policy.apply_limits(memory, cpu_seconds, OUTPUT_LIMIT)
    return child


def _parent_death_signal():
    """A function for a forked child that asks the kernel for SIGKILL when its parent thread ends
    (Linux prctl PR_SET_PDEATHSIG); looked up here, before the fork. A no-op elsewhere."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None
    return lambda: prctl(1, int(signal.SIGKILL), 0, 0, 0)


def _close_parent_ends(pipes) -> None:
    """The parent's ends of the ranks' pipes, once the job is over."""
    for (ctl, st) in pipes:
        for fd in (ctl[1], st[0]):
            try:
                os.close(fd)
            except OSError:
                pass


def _tail(path: Path, n: int = 4000) -> str:
    """The last `n` bytes of a log the ranks wrote (safe_read: never blocks, never reads more)."""
    from . import safe_read

    try:
        return safe_read.read(path, n, tail=True).decode("utf-8", "replace")
    except OSError:
        return ""


def _read_result(path: Path) -> dict | None:
    return _read_result_checked(path)[0]


def _read_result_checked(path: Path) -> tuple[dict | None, bool]:
    """(the payload, whether the file was missing or unreadable). A bad file is the learner's
    doing ("tamper"), unless the disk was full (`_check_disk_after`). Read through safe_read: a
    FIFO, a symbolic link, a device, a huge, sparse or growing file is refused without blocking
    and without reading more than RESULT_LIMIT."""
    from . import safe_read

    try:
        doc = json.loads(safe_read.read(path, RESULT_LIMIT).decode("utf-8"))
    except safe_read.UnsafeFile as e:
        return {"ok": False, "error": {"kind": "tamper", "message": f"结果文件{e.reason}：被改写了"}}, False
    except FileNotFoundError:
        return None, True
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {"ok": False, "error": {"kind": "tamper", "message": "结果文件不是合法的 JSON：被改写了"}}, True
    if not isinstance(doc, dict):
        return {"ok": False, "error": {"kind": "tamper", "message": "结果文件的格式不对"}}, False
    return doc, False


def _check_disk_after(folder: Path, bad_result: bool, stderr_tail: str = "") -> None:
    """A missing or cut-short result while the disk is (nearly) full, or from a child that says it
    ran out of space, means a full disk: a GraderProblem, not a crashed or forged submission."""
    if not bad_result:
        return
    free = _free_bytes(folder)
    low = free is not None and free < max(MIN_FREE_BYTES, RESULT_LIMIT)
    if low or "No space left on device" in stderr_tail or "[Errno 28]" in stderr_tail:
        raise GraderProblem(disk_full_zh(folder.parent.parent, free))     # work/ -> the grading's folder -> temp


def _read_results(folder: Path, world: int, stderr_tail: str = "") -> list:
    checked = [_read_result_checked(folder / f"result-{r}.json") for r in range(world)]
    _check_disk_after(folder, any(bad for _, bad in checked), stderr_tail)
    return [payload for payload, _ in checked]


def run_job(job: Job, source: str, timeout_s: float, memory_limit: int, use_sandbox: bool = True,
            keep_dir: bool = False) -> ChildRun:
    """Run every rank of `job` on `source`: forked from a warm worker (slots.py) on Linux, else in
    a fresh interpreter. Either way the same harness, sandbox and ready/go/done protocol.
    Raises GraderProblem when this machine cannot grade (no GPU for cuda, a full temp disk)."""
    require_backend(job.backend)
    _sweep_once()
    check_space()
    try:
        if not slots.ENABLED or keep_dir:
            return _run_cold(job, source, timeout_s, memory_limit, use_sandbox, keep_dir)
        return _run_slot(job, source, timeout_s, memory_limit, use_sandbox)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            folder = tempfile.gettempdir()
            raise GraderProblem(disk_full_zh(folder, _free_bytes(folder))) from None
        raise


def _run_slot(job: Job, source: str, timeout_s: float, memory_limit: int, use_sandbox: bool) -> ChildRun:
    gpu = job.backend == "cuda"
    slot = slots.take(gpu, use_sandbox)
    if not (slot.outer / OWNER_FILE).exists():
        mark_owner(slot.outer, slot.proc.pid)           # the folder lives as long as its worker
    reusable = False
    with _tracked(lambda: _kill_tree(slot.proc.pid)):
        try:
            if not slot.wait_warm() or not slot.prepare():
                log = slot.worker_log()
                raise RuntimeError(f"评分用的常驻进程没有启动：{log[-800:]}")
            run, reusable = _run_warm(slot, job, source, timeout_s, memory_limit)
            return run
        finally:
            slots.give_back(slot, reusable)


def _run_warm(slot, job: Job, source: str, timeout_s: float, memory_limit: int) -> tuple[ChildRun, bool]:
    world = job.world_size
    (slot.work / "submission.py").write_text(source, encoding="utf-8")
    job = job.with_(source_file=f"{slot.inside}/submission.py")
    if world > 1 and job.init_method is None:       # a fresh port per grading: the last one's may still be in TIME_WAIT
        job = job.with_(init_method=f"tcp://127.0.0.1:{29500 + slot.jobs % 2000}" if slot.inside == policy.SUBMISSION_DIR
                        else f"file://{slot.work}/rendezvous")
    (slot.work / "job.json").write_text(json.dumps(job.to_dict()), encoding="utf-8")
    pipes = [(os.pipe(), os.pipe()) for _ in range(world)]          # (ctl r, w), (status r, w)
    out_path, err_path = slot.outer / f"stdout-{slot.jobs}.txt", slot.outer / f"stderr-{slot.jobs}.txt"
    out, err = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    child_fds = [fd for (ctl, st) in pipes for fd in (ctl[0], st[1])] + [out, err]
    request = {"job": f"{slot.inside}/job.json", "world": world, "cpu_seconds": int(timeout_s) + 10,
               "memory": int(memory_limit), "output_limit": OUTPUT_LIMIT}
    t0 = time.perf_counter()
    try:
        slot.start(request, child_fds)
    finally:
        for fd in child_fds:
            os.close(fd)
    obs = [observer.RankObservation() for _ in range(world)]
    groups = _rank_groups(world, memory_limit) if slot.inside == policy.SUBMISSION_DIR else None
    try:
        sampler = observer.nvml_sampler(job.backend == "cuda")
        protocol_error, timed_out = _converse(slot.proc, pipes, obs, timeout_s, groups)
        if sampler is not None:
            peaks = sampler.stop()
            for o in obs:
                o.nvml_peak = peaks.get(o.host_pid)
        statuses, reusable = slot.finish()
    finally:
        reusable_groups = _remove_groups(groups)
    reusable = reusable and reusable_groups
    _close_parent_ends(pipes)
    stderr_tail = _tail(err_path)
    for path in (out_path, err_path):
        path.unlink(missing_ok=True)
    payloads = _read_results(slot.work, world, stderr_tail)
    returncode = next((s for s in statuses or [] if s), 0 if statuses else None)
    run = ChildRun(None, returncode, timed_out, time.perf_counter() - t0, stderr_tail,
                   protocol_error, obs, sandboxed=slot.inside == policy.SUBMISSION_DIR)
    run.cpu_seconds = getattr(slot, "cpu_seconds", None)
    merge_ranks(run, payloads)
    return run, reusable


def _run_cold(job: Job, source: str, timeout_s: float, memory_limit: int, use_sandbox: bool = True,
              keep_dir: bool = False) -> ChildRun:
    world = job.world_size
    outer = Path(tempfile.mkdtemp(prefix="vramlab-grade-"))
    mark_owner(outer)
    proc, pipes, child_fds, groups = None, [], [], None

    def kill() -> None:
        if proc is not None and proc.returncode is None:      # not reaped: the pid is still its own
            _kill_tree(proc.pid)         # bwrap and, through --die-with-parent, the sandbox

    with _tracked(kill):
        try:
            work = outer / "work"
            work.mkdir()
            inside = policy.SUBMISSION_DIR if use_sandbox else str(work)
            (work / "submission.py").write_text(source, encoding="utf-8")
            job = job.with_(source_file=f"{inside}/submission.py")
            if world > 1 and job.init_method is None:
                job = job.with_(init_method="tcp://127.0.0.1:29500" if use_sandbox else f"file://{work}/rendezvous")
            (work / "job.json").write_text(json.dumps(job.to_dict()), encoding="utf-8")
            for _ in range(world):
                ctl, st = os.pipe(), None
                pipes.append((ctl, (-1, -1)))
                child_fds.append(ctl[0])
                st = os.pipe()
                pipes[-1] = (ctl, st)                                 # (ctl r, w), (status r, w)
                child_fds.append(st[1])
            command = [sys.executable, "-I", "-B", "-X", "utf8", "-m", "vramlab.grader.launch", f"{inside}/job.json",
                       *[f"{ctl[0]},{st[1]}" for ctl, st in pipes]]
            gpu = job.backend == "cuda"
            argv = policy.bwrap_argv(work, command, gpu=gpu, confine=True) if use_sandbox else command
            env = policy.sandbox_env(gpu=gpu)
            if use_sandbox:
                env["VRAMLAB_CONFINE"] = "1"
            if not use_sandbox:
                env.update(HOME=str(work), TMPDIR=str(work), XDG_CACHE_HOME=str(work / ".cache"),
                           TORCHINDUCTOR_CACHE_DIR=str(work / ".inductor"))
            t0 = time.perf_counter()
            with open(outer / "stdout.txt", "wb") as out, open(outer / "stderr.txt", "wb") as err:
                proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        pass_fds=child_fds, preexec_fn=_limits(memory_limit, int(timeout_s) + 10),
                                        start_new_session=True)
            for fd in child_fds:
                os.close(fd)
            child_fds = []
            obs = [observer.RankObservation() for _ in range(world)]
            groups = _rank_groups(world, memory_limit) if use_sandbox else None
            sampler = observer.nvml_sampler(gpu)
            protocol_error, timed_out = _converse(proc, pipes, obs, timeout_s, groups)
            if sampler is not None:
                peaks = sampler.stop()
                for o in obs:
                    o.nvml_peak = peaks.get(o.host_pid)
            kill()
            proc.wait()
            stderr_tail = _tail(outer / "stderr.txt")
            payloads = _read_results(work, world, stderr_tail)
            run = ChildRun(None, proc.returncode, timed_out, time.perf_counter() - t0, stderr_tail,
                           protocol_error, obs, sandboxed=use_sandbox)
            merge_ranks(run, payloads)
            return run
        finally:        # every path, an exception or a stop signal included: no process, no folder left
            kill()
            _remove_groups(groups)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            for fd in child_fds:
                os.close(fd)
            _close_parent_ends(pipes)
            if not keep_dir:
                shutil.rmtree(outer, onerror=_unlock_and_retry)


def _rank_groups(world: int, memory_limit: int) -> list | None:
    """A memory cgroup per rank where this machine lets the grader make them (cgroup.py)."""
    hierarchy = cgroup.available()
    if hierarchy is None:
        return None
    groups = []
    try:
        for _ in range(world):
            groups.append(cgroup.RankGroup(hierarchy, memory_limit))
    except OSError:
        _remove_groups(groups)
        return None
    return groups


def _remove_groups(groups) -> bool:
    """Empty (kill what is left) and remove the ranks' groups; False if one would not go."""
    return all([g.remove() for g in groups or []])


def _converse(proc, pipes, obs, timeout_s: float, groups=None) -> tuple[str | None, bool]:
    """The ready/go/done exchange with every rank; returns (protocol error, timed out). `groups`:
    each rank's memory cgroup (cgroup.py), or None where there are none."""
    groups = groups or [None] * len(pipes)
    sel = selectors.DefaultSelector()
    buffers, phase = {}, {}
    for rank, (ctl, st) in enumerate(pipes):
        sel.register(st[0], selectors.EVENT_READ, rank)
        buffers[rank], phase[rank] = b"", "setup"
    known: set[int] = set()
    deadline = time.monotonic() + timeout_s
    grace = None          # honest ranks say done together (a barrier precedes it); a failed one alone
    try:
        while any(p != "done" for p in phase.values()):
            left = deadline - time.monotonic()
            if grace is not None and time.monotonic() > grace:
                return None, False         # the others wait in a collective for the rank that failed
            if left <= 0:
                return None, True
            events = sel.select(timeout=min(left, 0.5))
            if not events and proc.poll() is not None:
                return None, False                 # the sandbox ended before every rank said done
            for key, _ in events:
                rank = key.data
                chunk = os.read(key.fd, 4096)
                if not chunk:
                    sel.unregister(key.fd)
                    if phase[rank] != "done":
                        return None, False         # this rank ended without saying done
                    continue
                buffers[rank] += chunk
                while b"\n" in buffers[rank]:
                    line, buffers[rank] = buffers[rank].split(b"\n", 1)
                    error = _on_message(rank, line, phase, obs[rank], proc.pid, pipes[rank][0][1], known,
                                        groups[rank])
                    if error:
                        return error, False
                    if phase[rank] == "done" and any(p != "done" for p in phase.values()):
                        sel.unregister(key.fd)
                        grace = grace or time.monotonic() + RANK_GRACE_S
                        break
    finally:
        sel.close()
    return None, False


def _on_message(rank, line: bytes, phase, obs, root: int, ctl_w: int, known: set, group=None) -> str | None:
    try:
        msg = json.loads(line)
        event = msg["event"]
    except (ValueError, KeyError, TypeError):
        return None if phase[rank] != "setup" else "评分进程发来了无法识别的消息"
    if event == "started" and phase[rank] == "setup":      # trusted: the rank's first act
        observer.at_start(obs, root, int(msg["pid"]), group)
    elif event == "ready" and phase[rank] == "setup":      # trusted: no learner code has run yet
        obs.seccomp = msg.get("seccomp") is True
        if not observer.at_ready(obs, root, int(msg["pid"]), int(msg["allocated"]), group):
            return "评分器读不到评分进程的内存记录"
        known.update(observer.descendants(root))
        phase[rank] = "run"
        os.write(ctl_w, b"go")
    elif event == "done" and phase[rank] == "run":
        if not observer.at_done(obs, root, known, group):
            return "评分进程在评分器读取它的内存记录之前就结束了"
        try:
            if obs.host_pid is not None:
                os.kill(obs.host_pid, signal.SIGSTOP)         # nothing more runs in it
        except ProcessLookupError:
            return "评分进程在评分器读取它的内存记录之前就结束了"
        phase[rank] = "done"
    return None                                               # anything else: the learner's noise


def merge_ranks(run: ChildRun, payloads: list) -> None:
    """The ranks as one result: the first rank that failed if any did; otherwise rank 0's payload
    with the worst peak of all ranks and per-rank losses, updates and outputs side by side (each
    rank is compared with the same rank of the trusted run)."""
    run.rank_peaks = [_int(p.get("peak_bytes")) if isinstance(p, dict) else 0 for p in payloads]
    if len(payloads) == 1:
        run.payload = payloads[0]
        return
    # a rank that says why it failed first; a rank stopped while waiting for it has no result at all
    order = sorted(range(len(payloads)), key=lambda r: not isinstance(payloads[r], dict))
    for rank in order:
        p = payloads[rank]
        if not isinstance(p, dict) or not p.get("ok") or p.get("violations"):
            if isinstance(p, dict) and isinstance(p.get("error"), dict):
                p = dict(p, error=dict(p["error"], message=f"rank {rank}：{p['error'].get('message', '')}"))
            run.payload = p
            return
    merged = dict(payloads[0])
    merged["peak_bytes"] = max(run.rank_peaks)
    merged["rank_peak_bytes"] = run.rank_peaks
    for key in ("metric_bytes", "reserved_peak_bytes"):
        if key in merged:
            merged[key] = max(_int(p.get(key)) for p in payloads)
    for key in ("losses", "update", "outputs"):
        if key in merged:
            merged[key] = [x for p in payloads for x in (p.get(key) if isinstance(p.get(key), list) else [])]
    run.payload = merged


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
