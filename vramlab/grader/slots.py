"""Warm sandboxes kept between gradings: the parent's side of worker.py.

A slot is one sandbox (policy.py) whose pid 1 is a warm worker: torch and the models are imported
once, then each grading forks its ranks from it (a few tenths of a second instead of several
CPU-seconds of imports). Between two gradings the parent kills every process of the sandbox but
the worker and empties its folder; a slot whose folder was tampered with (its /tmp or /dev/shm
replaced), that still holds a process after the sweep, or whose worker died is closed, never
reused. Idle slots are kept per process (`MAX_IDLE` of each kind) and closed at exit: a
notebook's second `vramlab.check()` and every grading of a batch after the first find one warm.

Linux only: elsewhere (macOS has no bubblewrap, and forking a process that loaded torch is not
safe there) sandbox.py starts a fresh interpreter per grading as before.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import observer, policy

ENABLED = sys.platform == "linux" and os.environ.get("VRAMLAB_WARM_WORKERS", "1") != "0"
WARM_TIMEOUT_S = 300.0          # importing torch on a loaded 2-core machine can take a minute
EXIT_TIMEOUT_S = 10.0
MAX_IDLE = 3

_lock = threading.Lock()
_idle: dict[tuple, list["Slot"]] = {}


class Slot:
    """One warm sandbox. Not shared: a slot runs one grading at a time (`take` / `give_back`)."""

    def __init__(self, gpu: bool, use_sandbox: bool):
        self.key = (gpu, use_sandbox)
        self.outer = Path(tempfile.mkdtemp(prefix="vramlab-slot-"))
        self.work = self.outer / "work"
        self.work.mkdir()
        self.inside = policy.SUBMISSION_DIR if use_sandbox else str(self.work)
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-I", "-B", "-X", "utf8", "-m", "vramlab.grader.worker", str(theirs.fileno())]
        argv = policy.bwrap_argv(self.work, command, gpu=gpu, die_with_parent=False) if use_sandbox else command
        env = policy.sandbox_env(gpu=gpu)
        if not use_sandbox:
            (self.work / "tmp").mkdir(exist_ok=True)
            env.update(HOME=str(self.work), TMPDIR=str(self.work / "tmp"), XDG_CACHE_HOME=str(self.work / ".cache"),
                       TORCHINDUCTOR_CACHE_DIR=str(self.work / ".inductor"))
        with open(self.outer / "worker.log", "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=self.work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                                         start_new_session=True)
        theirs.close()
        self.sock, self.buffer = ours, b""
        self.warm, self.own_pids, self.jobs, self.skeleton = False, set(), 0, None
        self.folders = {name: os.lstat(self.work / name).st_ino for name in ("tmp", "shm") if (self.work / name).exists()}

    # -- the worker's messages ---------------------------------------------------------------------
    def _event(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def wait_warm(self, timeout: float = WARM_TIMEOUT_S) -> bool:
        if not self.warm:
            event = self._event(timeout)
            if not event or event.get("event") != "warm":
                return False
            self.warm = True
            self.own_pids = {self.proc.pid, *observer.descendants(self.proc.pid)}     # bwrap and the worker
        return self.proc.poll() is None

    def worker_log(self) -> str:
        try:
            return (self.outer / "worker.log").read_bytes()[-2000:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- one grading ---------------------------------------------------------------------------------
    def prepare(self) -> bool:
        """Empty the folder for the next grading; False if it cannot be trusted to be empty."""
        try:
            if self.skeleton is None:
                self.skeleton = _skeleton(self.work)
            for entry in os.scandir(self.work):
                if entry.name in self.folders:
                    if entry.is_symlink() or not entry.is_dir() or entry.inode() != self.folders[entry.name]:
                        return False
                    _empty(entry.path, self.skeleton)
                else:
                    _remove(entry)
            return all(os.lstat(self.work / name).st_ino == ino for name, ino in self.folders.items())
        except OSError:
            return False

    def start(self, request: dict, fds: list[int]) -> None:
        self.jobs += 1
        socket.send_fds(self.sock, [json.dumps(request).encode()], fds)

    def sweep(self) -> list[int]:
        """Kill every process of the sandbox but its own (the learner's, forked or not)."""
        killed: list[int] = []
        for _ in range(5):
            stray = [p for p in observer.descendants(self.proc.pid) if p not in self.own_pids]
            if not stray:
                break
            for pid in stray:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        return killed

    def finish(self) -> tuple[list | None, bool]:
        """After a grading: (the ranks' exit statuses, whether the slot may be reused)."""
        self.sweep()
        event = self._event(EXIT_TIMEOUT_S)
        statuses = event.get("statuses") if event and event.get("event") == "exited" else None
        clean = statuses is not None and self.proc.poll() is None and not self.sweep()
        return statuses, clean

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.outer, ignore_errors=True)


def _skeleton(work: Path) -> set[str]:
    """The folders bubblewrap made inside tmp/ as mount points (a course or venv under /tmp is
    bound on top of the private /tmp): they must stay, or the sandbox loses those mounts."""
    found = set()
    for name in ("tmp", "shm"):
        for root, dirs, _files in os.walk(work / name):
            found.update(os.path.join(root, d) for d in dirs)
    return found


def _empty(folder: str, keep: set[str]) -> None:
    for inner in os.scandir(folder):
        if inner.path in keep and inner.is_dir(follow_symlinks=False):
            _empty(inner.path, keep)
        else:
            _remove(inner)


def _remove(entry: os.DirEntry) -> None:
    if entry.is_dir(follow_symlinks=False):
        shutil.rmtree(entry.path, onerror=_unlock)
    else:
        os.unlink(entry.path)


def _unlock(func, path, _exc):
    """The learner may have made a folder unreadable: it is ours, make it writable and retry."""
    parent = os.path.dirname(path)
    os.chmod(parent, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
    func(path)


def take(gpu: bool, use_sandbox: bool) -> Slot:
    """An idle warm slot of this kind, or a new one (warming up in the background)."""
    with _lock:
        idle = _idle.get((gpu, use_sandbox), [])
        while idle:
            slot = idle.pop()
            if slot.proc.poll() is None:
                return slot
            slot.close()
    return Slot(gpu, use_sandbox)


def give_back(slot: Slot, reusable: bool) -> None:
    with _lock:
        idle = _idle.setdefault(slot.key, [])
        if reusable and slot.proc.poll() is None and len(idle) < MAX_IDLE:
            idle.append(slot)
            return
    slot.close()


@atexit.register
def close_all() -> None:
    with _lock:
        slots = [s for group in _idle.values() for s in group]
        _idle.clear()
    for slot in slots:
        slot.close()
