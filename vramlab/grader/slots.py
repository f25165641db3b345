"""Warm sandboxes kept between gradings: the parent's side of worker.py.

A slot is one sandbox (policy.py) whose pid 1 is a warm worker: torch and the models are imported
once, then each grading forks its ranks from it (a few tenths of a second instead of several
CPU-seconds of imports). Between two gradings the parent kills every process of the sandbox but
the worker and empties its folder; a slot whose folder was tampered with (its /tmp or /dev/shm
replaced), that still holds a process after the sweep, or whose worker died is closed, never
reused. Idle slots are kept per process (`MAX_IDLE` of each kind): a notebook's second
`vramlab.check()` and every grading of a batch after the first find one warm.

At exit a process parks its idle slots instead of closing them (`MAX_PARKED` of each kind, for
`VRAMLAB_WARM_PARK_S` seconds, default 300; 0 turns parking off): the next process of the same
user, code and versions (the next `vramlab grade`, a new kernel's `vramlab.check()`, nbgrader
validating the next notebook) claims one instead of paying the imports again. A parked slot is
written down in a folder only its user can enter (`park_dir`) with the pids, folder and inodes it
must still have; a claim renames that record (one claimant wins), connects to the worker's
listening socket and checks everything again: a slot whose process was replaced, that holds a
process it should not, or whose folder changed is killed, never used.

Linux only: elsewhere (macOS has no bubblewrap, and forking a process that loaded torch is not
safe there) sandbox.py starts a fresh interpreter per grading as before.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import stat
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
MAX_PARKED = 2
PARK_S = float(os.environ.get("VRAMLAB_WARM_PARK_S", "300") or 0)
CLAIM_TIMEOUT_S = 5.0

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
        passed = [theirs.fileno()]
        self.listen_path, listener = None, None
        folder = park_dir() if PARK_S > 0 else None
        if folder is not None:
            try:
                self.listen_path = folder / f"{self.outer.name}.sock"
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                _at(self.listen_path, listener.bind)
                listener.listen(1)
                command += [str(listener.fileno()), str(PARK_S)]
                passed.append(listener.fileno())
            except OSError:
                self.listen_path, listener = None, None
        argv = policy.bwrap_argv(self.work, command, gpu=gpu, die_with_parent=False, confine=True) if use_sandbox else command
        env = policy.sandbox_env(gpu=gpu)
        if use_sandbox:
            env["VRAMLAB_CONFINE"] = "1"
        if not use_sandbox:
            (self.work / "tmp").mkdir(exist_ok=True)
            env.update(HOME=str(self.work), TMPDIR=str(self.work / "tmp"), XDG_CACHE_HOME=str(self.work / ".cache"),
                       TORCHINDUCTOR_CACHE_DIR=str(self.work / ".inductor"))
        with open(self.outer / "worker.log", "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=self.work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=tuple(passed),
                                         start_new_session=True)
        theirs.close()
        if listener is not None:
            listener.close()                # the worker holds it
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
            if not self.own_pids:           # bwrap and the worker (a claimed slot keeps what was recorded)
                self.own_pids = {self.proc.pid, *observer.descendants(self.proc.pid)}
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
        """Kill every process of the sandbox but its own (the learner's, forked or not) and wait
        until each has died. A dead process awaiting its reaper (a zombie) holds no memory: the
        worker reaps it and reports the ranks' ends in `finish`."""
        killed: list[int] = []
        for _ in range(5):
            stray = [p for p in observer.descendants(self.proc.pid, living=True) if p not in self.own_pids]
            if not stray:
                break
            for pid in stray:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            observer.wait_dead(stray, timeout_s=1.0)
        return killed

    def finish(self) -> tuple[list | None, bool]:
        """After a grading: (the ranks' exit statuses, whether the slot may be reused)."""
        self.sweep()
        event = self._event(EXIT_TIMEOUT_S)
        statuses = event.get("statuses") if event and event.get("event") == "exited" else None
        self.cpu_seconds = event.get("cpu_seconds") if statuses is not None else None
        # a sandboxed worker that could not give each grading its own IPC namespace serves one grading only
        isolated = statuses is not None and (event.get("isolated") is True or self.inside != policy.SUBMISSION_DIR)
        self.ipc_objects_dropped = event.get("ipc_objects_dropped") if statuses is not None else None
        clean = statuses is not None and isolated and self.proc.poll() is None and not self.sweep()
        return statuses, clean

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        _kill(self.proc.pid, self.own_pids)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.outer, ignore_errors=True)
        if self.listen_path is not None:
            _unlink(self.listen_path)

    # -- parking: the next process of this user takes the slot over ---------------------------------
    def park(self) -> bool:
        """Leave this idle slot for the next process (see the module doc); False: close it instead."""
        if self.listen_path is None or not self.warm or self.proc.poll() is not None:
            return False
        folder = park_dir()
        if folder is None:
            return False
        if sum(_record_of(p) == [code_version(), list(self.key)] for p in folder.glob("*.json")) >= MAX_PARKED:
            return False
        if not self.prepare() or self.sweep():
            return False
        record = {"version": code_version(), "key": list(self.key), "pid": self.proc.pid,
                  "start": _start_time(self.proc.pid), "own_pids": sorted(self.own_pids), "outer": str(self.outer),
                  "inside": self.inside, "folders": self.folders, "skeleton": sorted(self.skeleton or ()),
                  "socket": str(self.listen_path), "jobs": self.jobs, "until": time.time() + PARK_S}
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, folder / f"{self.outer.name}.json")
        except OSError:
            return False
        try:                                # a worker whose parent just vanished ends instead (worker.serve)
            self.sock.sendall(json.dumps({"park": True}).encode())
        except OSError:
            _unlink(folder / f"{self.outer.name}.json")
            return False
        self.sock.close()                   # the worker goes back to waiting on its listening socket
        return True

    @classmethod
    def claim(cls, record: dict) -> "Slot | None":
        """The parked slot `record` describes, connected and checked; None (and the slot killed)
        if anything about it is not as it was left."""
        self = cls.__new__(cls)
        self.key, self.outer = tuple(record["key"]), Path(record["outer"])
        self.work, self.inside = self.outer / "work", record["inside"]
        self.proc = _Parked(int(record["pid"]), record["start"])
        self.own_pids, self.folders = {int(p) for p in record["own_pids"]}, dict(record["folders"])
        self.skeleton, self.jobs = set(record["skeleton"]), int(record["jobs"])
        self.listen_path, self.sock, self.buffer, self.warm = Path(record["socket"]), None, b"", False
        try:
            if self.proc.poll() is not None:
                raise OSError("gone")
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(CLAIM_TIMEOUT_S)
            _at(self.listen_path, self.sock.connect)
            self.sock.settimeout(None)
            if not self.wait_warm(CLAIM_TIMEOUT_S) or self.sweep() or not self.prepare():
                raise OSError("changed")
        except OSError:
            if self.sock is None:
                self.sock = socket.socket()
            self.close()
            return None
        return self


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


class _Parked:
    """The parts of Popen that a slot uses, for a worker another process started: the pid is
    trusted only while /proc says it is the same process (its start time) and not a zombie."""

    def __init__(self, pid: int, start):
        self.pid, self.start = pid, start

    def poll(self):
        return None if _start_time(self.pid) == self.start else 0

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("parked worker", timeout)
            time.sleep(0.02)
        return 0


def _start_time(pid: int):
    """The start time of a live (not zombie) process, from /proc/PID/stat; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _kill(pid: int, own: set[int]) -> None:
    """bwrap's process group, then every process the slot owns (the worker may be in a session of its own)."""
    for send, target in ((os.killpg, pid), *((os.kill, p) for p in own)):
        try:
            send(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _at(path: Path, call) -> None:
    """bind/connect a unix socket at `path`, also when the path is longer than a socket address
    may be (108 bytes): through /proc/self/fd/N/NAME, N an open handle on its folder."""
    if len(os.fsencode(str(path))) < 100:
        return call(str(path))
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        return call(f"/proc/self/fd/{folder}/{path.name}")
    finally:
        os.close(folder)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def park_dir() -> Path | None:
    """This user's folder of parked slots (mode 0700, owned by us); None if it cannot be trusted."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"vramlab-slots-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What a parked worker must share with its claimant: interpreter, vramlab's code, and the
    installed torch / transformers / peft (their versions, read without importing them)."""
    from importlib import metadata

    h = hashlib.sha256(f"{sys.executable}|{sys.version}|{policy.PACKAGE_DIR}".encode())
    for name in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            h.update(f"|{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"|{name}=-".encode())
    for path in sorted(policy.PACKAGE_DIR.rglob("*.py")):
        h.update(str(path.relative_to(policy.PACKAGE_DIR)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _record_of(path: Path) -> list | None:
    """[version, key] of a parked slot's record."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return [record.get("version"), record.get("key")]
    except (OSError, ValueError, AttributeError):
        return None


def _end(record: dict) -> None:
    """End a parked slot that will not be used: its worker if still there, its folder, its socket."""
    pid = int(record.get("pid") or 0)
    if pid and _start_time(pid) == record.get("start"):
        _kill(pid, {int(p) for p in record.get("own_pids") or ()})
    outer = Path(str(record.get("outer") or "/nonexistent"))
    if outer.name.startswith("vramlab-slot-") and outer.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(outer, ignore_errors=True)
    if record.get("socket"):
        _unlink(Path(record["socket"]))


def _take(path: Path) -> bool:
    """Take a parked slot's record out of the folder; False if another process took it first
    (renaming is atomic: one taker wins)."""
    taken = path.with_name(f".taken-{os.getpid()}-{path.name}")
    try:
        os.rename(path, taken)
    except OSError:
        return False
    _unlink(taken)
    return True


def end_parked() -> int:
    """End every slot parked with this code (a test run's, when it finishes); how many."""
    folder, ended = park_dir(), 0
    for path in sorted(folder.glob("*.json")) if folder is not None else ():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if record.get("version") != code_version() or not _take(path):
            continue
        _end(record)
        ended += 1
    return ended


def _claim_parked(key: tuple) -> Slot | None:
    folder = park_dir() if PARK_S > 0 else None
    if folder is None:
        return None
    version = code_version()
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        dead = _start_time(int(record.get("pid", 0))) != record.get("start") or time.time() > record.get("until", 0)
        if not dead and (record.get("version") != version or tuple(record.get("key", ())) != key):
            continue                        # another checkout's or kind's slot: not ours to use or end
        if not _take(path):
            continue
        if dead:
            _end(record)
            continue
        slot = Slot.claim(record)
        if slot is not None:
            return slot
    return None


def take(gpu: bool, use_sandbox: bool) -> Slot:
    """An idle warm slot of this kind: this process's, else one parked by an earlier process, else
    a new one (warming up in the background)."""
    with _lock:
        idle = _idle.get((gpu, use_sandbox), [])
        while idle:
            slot = idle.pop()
            if slot.proc.poll() is None:
                return slot
            slot.close()
    return _claim_parked((gpu, use_sandbox)) or Slot(gpu, use_sandbox)


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
        if not slot.park():
            slot.close()
