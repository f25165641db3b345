"""Kernel memory accounting for one grading rank: a memory cgroup made by the parent.

The resident-set reading (VmHWM) counts only pages mapped into the rank's address space. Memory can
be held without being mapped: a memfd or tmpfs file written through a window that is unmapped
again, SysV or POSIX shared memory, pipe and socket buffers, the page cache of a file. The kernel
still charges every one of those pages to the memory cgroup of the process that made it, so the
parent (outside the sandbox, where the learner cannot reach) puts each rank into a cgroup of its
own the moment it says `ready` (no learner code has run; the rank waits for `go`) and reads the
group's peak charge when it says `done`:

    cgroup v1:  memory.max_usage_in_bytes      cgroup v2:  memory.peak

Charges made before the move stay with the worker's group (v1 `move_charge_at_immigrate` is 0;
v2 never moves charges), so the group's peak is the memory the learner's phase added, whatever
kind of memory it was. The group's process list is the census: the rank, and nothing else.

Moving a process costs the kernel an RCU grace period (~8 ms here: cgroup.procs takes the global
threadgroup lock), paid while the parent waits to say `go`. Where the group's peak can be reset
(v1 always; v2 from Linux 6.12), the parent moves the rank as soon as it says `started`, while it
still builds its model, and at `ready` resets the peak and reads the usage: the learner's phase
added  peak - usage_at_ready , the same figure without the wait.

Where the groups can be made:
- v1 (these machines): a child of the grader's own memory group; root can write there.
- v2: a delegated subtree (systemd: `systemd-run --user --scope -p Delegate=yes ...`). The grader's
  group must be empty to hand controllers down, so the grader moves itself into a leaf `grader`
  first. `VRAMLAB_CGROUP=/sys/fs/cgroup/...` names the delegated group explicitly.
Where neither works (a laptop without privileges) `available()` is None and says why; the grader
keeps the resident-set reading and tells the learner the result is not an official grade.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "vramlab-"
_counter = itertools.count()
_lock = threading.Lock()


@dataclass(frozen=True)
class Hierarchy:
    version: int            # 1 or 2
    base: Path              # the folder under which grading groups are made

    @property
    def peak_file(self) -> str:
        return "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"

    @property
    def usage_file(self) -> str:
        return "memory.usage_in_bytes" if self.version == 1 else "memory.current"


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, fs type, super options) of each cgroup mount."""
    found = []
    try:
        with open(mountinfo, encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts, rparts = left.split(), right.split()
                if len(rparts) >= 3 and rparts[0] in ("cgroup", "cgroup2"):
                    found.append((parts[4], parts[3], rparts[0], rparts[2]))
    except OSError:
        pass
    return found


def _own_paths(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """controller -> this process's path ("" key: the v2 unified path)."""
    paths = {}
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            for line in f:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    paths[c] = path
    except (OSError, ValueError):
        pass
    return paths


def _inside(mount: str, root: str, path: str) -> Path:
    """The folder of cgroup `path` in a hierarchy mounted at `mount` whose mount shows `root`."""
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return Path(mount) / ("" if rel == "." else rel)


def _writable_dir(folder: Path) -> bool:
    probe = folder / f"{PREFIX}probe-{os.getpid()}-{next(_counter)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        probe.rmdir()
    except OSError:
        pass
    return True


def _find_v1(mounts, own) -> Hierarchy | None:
    for mount, root, fstype, options in mounts:
        if fstype == "cgroup" and "memory" in options.split(","):
            folder = _inside(mount, root, own.get("memory", "/"))
            if (folder / "memory.max_usage_in_bytes").exists() and _writable_dir(folder):
                return Hierarchy(1, folder)
    return None


def _find_v2(mounts, own) -> Hierarchy | None:
    explicit = os.environ.get("VRAMLAB_CGROUP")
    explicit = explicit if explicit and explicit.startswith("/") else None
    candidates = [Path(explicit)] if explicit else [
        _inside(m, r, own.get("", "/")) for m, r, t, _o in mounts if t == "cgroup2"]
    for folder in candidates:
        try:
            if "memory" not in (folder / "cgroup.controllers").read_text().split():
                continue
        except OSError:
            continue
        if _delegate(folder):
            return Hierarchy(2, folder)
    return None


def _delegate(folder: Path) -> bool:
    """Make `folder` hand memory and pids down to children: v2 allows that only in a group with no
    processes of its own, so the processes in it (this grader) move into a leaf `grader`."""
    control = folder / "cgroup.subtree_control"

    def handed_down() -> bool:
        return "memory" in [c.lstrip("+") for c in control.read_text().split()]
    try:
        if handed_down():
            return _writable_dir(folder)
        procs = [p for p in (folder / "cgroup.procs").read_text().split() if p]
        if procs:
            leaf = folder / "grader"
            leaf.mkdir(exist_ok=True)
            for pid in procs:
                (leaf / "cgroup.procs").write_text(pid)
        control.write_text("+memory +pids" if "pids" in (folder / "cgroup.controllers").read_text().split()
                           else "+memory")
        return handed_down() and _writable_dir(folder)
    except OSError:
        return False


_found: tuple[Hierarchy | None, str] | None = None


def available() -> Hierarchy | None:
    """The hierarchy grading groups are made in, or None (`why_not()` says why, in Chinese)."""
    global _found
    with _lock:
        if _found is None:
            if os.environ.get("VRAMLAB_CGROUP") == "off":          # tests: the resident-set reading alone
                _found = (None, "已用 VRAMLAB_CGROUP=off 关闭")
            else:
                mounts, own = _mounts(), _own_paths()
                h = _find_v1(mounts, own) or _find_v2(mounts, own)
                _found = (h, "" if h else
                          "这台机器上评分器不能创建内存 cgroup（cgroup v1 需要对自己的 memory 组有写权限；"
                          "cgroup v2 需要一个委派的子树，例如 systemd-run --user --scope -p Delegate=yes）")
        return _found[0]


NO_CGROUP_WARNING = ("⚠ 这台机器上评分器不能为评分进程创建内存 cgroup：进程外的内存读数只看得到映射进地址空间的内存，"
                     "藏在内存文件、管道或共享内存里的不算。这次的结果可以参考，但不是正式成绩。")
NO_CGROUP_REFUSAL = ("评分器不能为评分进程创建内存 cgroup，拒绝正式评分：内核按 cgroup 记账才能数到学员进程占用的每一个字节。"
                     "cgroup v1 下用 root 运行；cgroup v2 下在一个委派的子树里运行（例如 "
                     "systemd-run --user --scope -p Delegate=yes vramlab ...）。确实要在没有 cgroup 的情况下评分，"
                     "请加 --no-cgroup（或设置 VRAMLAB_CGROUP=optional），结果就不是正式成绩")


def optional() -> bool:
    """The instructor accepted grading without kernel accounting (`--no-cgroup`)."""
    return os.environ.get("VRAMLAB_CGROUP") in ("optional", "off")


def why_not() -> str:
    available()
    return _found[1] if _found else ""


def reset_detection() -> None:
    """Forget what `available()` found (tests)."""
    global _found
    with _lock:
        _found = None


class RankGroup:
    """One rank's memory cgroup: made by the parent, the rank moved in at `ready`, read at `done`,
    emptied and removed when the grading ends."""

    @classmethod
    def existing(cls, hierarchy: Hierarchy, path: Path) -> "RankGroup":
        """A group made earlier (by a grader that was killed), to empty and remove."""
        group = cls.__new__(cls)
        group.h, group.path, group._peak_fd, group.resettable = hierarchy, path, None, False
        return group

    def __init__(self, hierarchy: Hierarchy, limit_bytes: int | None = None):
        self.h = hierarchy
        self.path = hierarchy.base / f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self._peak_fd: int | None = None
        self.path.mkdir()
        if limit_bytes:              # a hard cap for what rlimits cannot bound (pipes, tmpfs, page cache)
            try:
                (self.path / hierarchy.limit_file).write_text(str(int(limit_bytes)))
            except OSError:
                pass
        self.resettable = self.reset_peak()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def reset_peak(self) -> bool:
        """Restart the peak from the current usage; False where the kernel cannot. v1: write 0 to
        memory.max_usage_in_bytes. v2 (Linux 6.12+): write to an open memory.peak, whose later
        reads through that same descriptor give the peak since the write."""
        try:
            if self.h.version == 1:
                (self.path / self.h.peak_file).write_text("0")
                return True
            if self._peak_fd is None:
                self._peak_fd = os.open(self.path / self.h.peak_file, os.O_RDWR | os.O_CLOEXEC)
            os.write(self._peak_fd, b"reset\n")
            return True
        except OSError:
            return False

    def usage(self) -> int:
        return int((self.path / self.h.usage_file).read_text().split()[0])

    def peak(self) -> int:
        if self._peak_fd is not None:
            return int(os.pread(self._peak_fd, 64, 0).split()[0])
        return int((self.path / self.h.peak_file).read_text().split()[0])

    def procs(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self, wait_s: float = 5.0) -> bool:
        """Kill whatever is still in the group and remove it; False if it would not go."""
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None
        deadline = time.monotonic() + wait_s
        while True:
            for pid in self.procs():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


def sweep_stale() -> list[str]:
    """Remove grading groups left by a grader that was killed (their name holds its pid)."""
    h = available()
    removed = []
    if h is None:
        return removed
    try:
        entries = list(os.scandir(h.base))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX) or not entry.is_dir():
            continue
        try:
            owner = int(entry.name[len(PREFIX):].split("-")[0])
        except ValueError:
            continue
        if owner == os.getpid() or os.path.exists(f"/proc/{owner}"):
            continue
        if RankGroup.existing(h, Path(entry.path)).remove(wait_s=1.0):
            removed.append(entry.path)
    return removed
