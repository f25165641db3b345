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
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import observer, policy, slots
from ..units import MiB

OUTPUT_LIMIT = 64 * MiB
RANK_GRACE_S = 20.0        # how long the other ranks may take to say done after the first one did
RESULT_LIMIT = 8 * MiB


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


def _limits(memory: int, cpu_seconds: int):
    return lambda: policy.apply_limits(memory, cpu_seconds, OUTPUT_LIMIT)


def _close_parent_ends(pipes) -> None:
    """The parent's ends of the ranks' pipes, once the job is over."""
    for (ctl, st) in pipes:
        for fd in (ctl[1], st[0]):
            try:
                os.close(fd)
            except OSError:
                pass


def _tail(path: Path, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_result(path: Path) -> dict | None:
    try:
        if path.stat().st_size > RESULT_LIMIT:
            return {"ok": False, "error": {"kind": "tamper", "message": "结果文件大得不正常"}}
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):
        return {"ok": False, "error": {"kind": "tamper", "message": "结果文件不是合法的 JSON：被改写了"}}
    return doc if isinstance(doc, dict) else {"ok": False, "error": {"kind": "tamper", "message": "结果文件的格式不对"}}


def run_job(job: dict, source: str, timeout_s: float, memory_limit: int, use_sandbox: bool = True,
            keep_dir: bool = False) -> ChildRun:
    """Run every rank of `job` on `source`: forked from a warm worker (slots.py) on Linux, else in
    a fresh interpreter. Either way the same harness, sandbox and ready/go/done protocol."""
    if not slots.ENABLED or keep_dir:
        return _run_cold(job, source, timeout_s, memory_limit, use_sandbox, keep_dir)
    gpu = job.get("backend") == "cuda"
    slot = slots.take(gpu, use_sandbox)
    reusable = False
    try:
        if not slot.wait_warm() or not slot.prepare():
            log = slot.worker_log()
            raise RuntimeError(f"the grading worker did not start: {log[-800:]}")
        run, reusable = _run_warm(slot, job, source, timeout_s, memory_limit)
        return run
    finally:
        slots.give_back(slot, reusable)


def _run_warm(slot, job: dict, source: str, timeout_s: float, memory_limit: int) -> tuple[ChildRun, bool]:
    world = int(job.get("world_size", 1))
    (slot.work / "submission.py").write_text(source, encoding="utf-8")
    job = dict(job, source_file=f"{slot.inside}/submission.py")
    if world > 1:       # a fresh port per grading: the last one's may still be in TIME_WAIT
        job.setdefault("init_method", f"tcp://127.0.0.1:{29500 + slot.jobs % 2000}" if slot.inside == policy.SUBMISSION_DIR
                       else f"file://{slot.work}/rendezvous")
    (slot.work / "job.json").write_text(json.dumps(job), encoding="utf-8")
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
    sampler = observer.nvml_sampler(job.get("backend") == "cuda")
    protocol_error, timed_out = _converse(slot.proc, pipes, obs, timeout_s)
    if sampler is not None:
        peaks = sampler.stop()
        for o in obs:
            o.nvml_peak = peaks.get(o.host_pid)
    statuses, reusable = slot.finish()
    _close_parent_ends(pipes)
    payloads = [_read_result(slot.work / f"result-{r}.json") for r in range(world)]
    returncode = next((s for s in statuses or [] if s), 0 if statuses else None)
    run = ChildRun(None, returncode, timed_out, time.perf_counter() - t0, _tail(err_path),
                   protocol_error, obs, sandboxed=slot.inside == policy.SUBMISSION_DIR)
    merge_ranks(run, payloads)
    for path in (out_path, err_path):
        path.unlink(missing_ok=True)
    return run, reusable


def _run_cold(job: dict, source: str, timeout_s: float, memory_limit: int, use_sandbox: bool = True,
              keep_dir: bool = False) -> ChildRun:
    world = int(job.get("world_size", 1))
    outer = Path(tempfile.mkdtemp(prefix="vramlab-grade-"))
    work = outer / "work"
    work.mkdir()
    inside = policy.SUBMISSION_DIR if use_sandbox else str(work)
    (work / "submission.py").write_text(source, encoding="utf-8")
    job = dict(job, source_file=f"{inside}/submission.py")
    if world > 1:
        job.setdefault("init_method", "tcp://127.0.0.1:29500" if use_sandbox else f"file://{work}/rendezvous")
    (work / "job.json").write_text(json.dumps(job), encoding="utf-8")
    pipes = [(os.pipe(), os.pipe()) for _ in range(world)]          # (ctl r, w), (status r, w)
    child_fds = [fd for (ctl, st) in pipes for fd in (ctl[0], st[1])]
    command = [sys.executable, "-I", "-B", "-X", "utf8", "-m", "vramlab.grader.launch", f"{inside}/job.json",
               *[f"{ctl[0]},{st[1]}" for ctl, st in pipes]]
    gpu = job.get("backend") == "cuda"
    argv = policy.bwrap_argv(work, command, gpu=gpu) if use_sandbox else command
    env = policy.sandbox_env(gpu=gpu)
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
    obs = [observer.RankObservation() for _ in range(world)]
    sampler = observer.nvml_sampler(gpu)
    protocol_error, timed_out = _converse(proc, pipes, obs, timeout_s)
    if sampler is not None:
        peaks = sampler.stop()
        for o in obs:
            o.nvml_peak = peaks.get(o.host_pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)        # bwrap and, through --die-with-parent, the sandbox
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _close_parent_ends(pipes)
    payloads = [_read_result(work / f"result-{r}.json") for r in range(world)]
    run = ChildRun(None, proc.returncode, timed_out, time.perf_counter() - t0, _tail(outer / "stderr.txt"),
                   protocol_error, obs, sandboxed=use_sandbox)
    merge_ranks(run, payloads)
    if not keep_dir:
        shutil.rmtree(outer, ignore_errors=True)
    return run


def _converse(proc, pipes, obs, timeout_s: float) -> tuple[str | None, bool]:
    """The ready/go/done exchange with every rank; returns (protocol error, timed out)."""
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
                    error = _on_message(rank, line, phase, obs[rank], proc.pid, pipes[rank][0][1], known)
                    if error:
                        return error, False
                    if phase[rank] == "done" and any(p != "done" for p in phase.values()):
                        sel.unregister(key.fd)
                        grace = grace or time.monotonic() + RANK_GRACE_S
                        break
    finally:
        sel.close()
    return None, False


def _on_message(rank, line: bytes, phase, obs, root: int, ctl_w: int, known: set) -> str | None:
    try:
        msg = json.loads(line)
        event = msg["event"]
    except (ValueError, KeyError, TypeError):
        return None if phase[rank] != "setup" else "评分进程发来了无法识别的消息"
    if event == "ready" and phase[rank] == "setup":        # trusted: no learner code has run yet
        if not observer.at_ready(obs, root, int(msg["pid"]), int(msg["allocated"])):
            return "评分器读不到评分进程的内存记录"
        known.update(observer.descendants(root))
        phase[rank] = "run"
        os.write(ctl_w, b"go")
    elif event == "done" and phase[rank] == "run":
        if not observer.at_done(obs, root, known):
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
