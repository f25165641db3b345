"""The parent's own measurement of a grading, read from outside the sandbox.

The simulated device counts memory inside the learner's interpreter, so the learner's code can
lie about it (patch the meter, hide tensors in numpy arrays, rewrite the result file). The kernel's
record of the process cannot be reached from inside: /proc is read-only in the sandbox, so only
the parent can reset the peak resident-set counter (VmHWM, via /proc/PID/clear_refs) and read it.

At `ready` (no learner code has run) the parent reads the process's resident size and resets its
high-water mark; at `done` it reads the mark and the bytes the process wrote. The real memory the
learner's phase added is then  hwm - rss_at_ready;  the part of it that the reported device peak
does not explain is

    unexplained = (hwm - rss_at_ready) - (reported_peak - device_bytes_at_ready)

Where the grader can make memory cgroups (cgroup.py), `hwm - rss_at_ready` is replaced by the
peak charge of the rank's own cgroup, which holds the rank from `ready` (cgroup.py): the kernel
charges that group for every page the learner's phase makes, mapped or not (anonymous memory,
memfd and tmpfs files, System V and POSIX shared memory, page cache, pipe and socket buffers,
kernel memory), so no hiding place needs a rule of its own. The group's process list at `done`
is the census: the rank and nothing else.

It is about the same for the trusted starter and an honest submission of the same exercise (the
same interpreter, model and data; on the simulated device a constant offset of counted-but-never-
touched bytes such as the cuBLAS workspace). A learner who hides memory from the meter raises it by
what was hidden. On a GPU the same check covers host memory; device memory is NVML's per-process
figure, sampled by the parent (`NvmlSampler`).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

MiB = 2 ** 20
# Linux, and a /proc we may write (inside the nbgrader kernel's sandbox /proc is read-only: no observer)
AVAILABLE = os.path.exists("/proc/self/status") and os.access("/proc/self/clear_refs", os.W_OK)
# An honest submission's unexplained bytes may differ from the starter's by library buffers and
# allocator rounding: measured up to ~10 MiB here and 16.2 MiB on the CI machine (ch07's honest
# checkpointing variants against one starter run), hence 24 MiB; the starter run kept for
# comparison is the noisier of two (baselines.py).
TOLERANCE_BYTES = 24 * MiB
TOLERANCE_FRACTION = 0.06          # of the starter's peak, for the larger GPU scales
WRITE_LIMIT_BYTES = 16 * MiB       # what the learner's phase may write beyond the starter's (logs), not tensors
# NVML counts the CUDA context and the allocator's reserved (not only allocated) memory: looser
NVML_TOLERANCE_BYTES = 64 * MiB
NVML_TOLERANCE_FRACTION = 0.10


@dataclass
class RankObservation:
    """What the parent read of one rank's process; None where the process did not get that far."""
    ns_pid: int | None = None
    host_pid: int | None = None
    device_at_ready: int | None = None          # reported before any learner code: trusted
    rss_at_ready: int | None = None
    hwm: int | None = None
    written: int | None = None
    nvml_peak: int | None = None
    extra_processes: list = field(default_factory=list)
    cgroup_peak: int | None = None              # the rank's own memory cgroup, from `ready` to `done`
    cgroup_base: int = 0                        # the group's usage at `ready` (a rank moved in at `started`)
    in_group: bool = False                      # moved into its group at `started`
    seccomp: bool | None = None                 # the rank said its kernel filter is in force (confine.py)


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
            elif key == "NSpid":
                out[key] = [int(x) for x in value.split()]
    return out


def _written(pid: int) -> int:
    """Bytes written through write() calls plus bytes dirtied in files (mmap) by the process."""
    fields = {}
    with open(f"/proc/{pid}/io", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = int(value)
    return fields.get("wchar", 0) + fields.get("write_bytes", 0)


def descendants(root: int, living: bool = False) -> list[int]:
    """Every process below `root` (by parent pid; /proc/PID/task/*/children is not always there);
    `living`: without the dead ones not yet reaped (zombies)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
                if not (living and state in ("Z", "X")):
                    parent[int(name)] = int(ppid)
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return found


def wait_dead(pids, timeout_s: float) -> None:
    """Wait until each of `pids` has died (a zombie counts as dead) or `timeout_s` passed: on its
    pidfd where the kernel has them, else by looking every 5 ms."""
    import select
    import time

    deadline = time.monotonic() + timeout_s
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        try:
            while time.monotonic() < deadline:
                if fd is not None:
                    select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                    break
                try:
                    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                            break
                except (OSError, IndexError):
                    break
                time.sleep(0.005)
        finally:
            if fd is not None:
                os.close(fd)


def host_pid_of(root: int, ns_pid: int) -> int | None:
    """The parent's pid of the sandboxed process whose own pid (in its namespace) is `ns_pid`."""
    for pid in descendants(root):
        try:
            nspid = _status(pid).get("NSpid") or []
        except OSError:
            continue
        if nspid and nspid[-1] == ns_pid:
            return pid
    return None


def at_start(obs: RankObservation, root: int, ns_pid: int, group=None) -> None:
    """The rank has just started (no learner code yet): move it into its memory cgroup now, while
    it builds its model, where the group's peak can be reset at `ready` (cgroup.py: a move costs
    a grace period). Otherwise, or if anything fails, `at_ready` moves it."""
    if not AVAILABLE or group is None or not group.resettable:
        return
    pid = host_pid_of(root, ns_pid)
    if pid is None:
        return
    try:
        group.add(pid)
    except OSError:
        return
    obs.host_pid, obs.in_group = pid, True


def at_ready(obs: RankObservation, root: int, ns_pid: int, device_bytes: int, group=None) -> bool:
    """Read the rank before its learner phase, reset its high-water mark and put it into its own
    memory cgroup (`group`, cgroup.RankGroup) where there is one: reset the group's peak if the
    rank is there already, move it in otherwise. False if it cannot."""
    obs.ns_pid, obs.device_at_ready = ns_pid, device_bytes
    if not AVAILABLE:
        return True                        # macOS: nothing to read; the self-check says it is unsandboxed
    pid = host_pid_of(root, ns_pid)
    if pid is None:
        return False
    if pid != obs.host_pid:                # not the process that said `started`: trust nothing of it
        obs.in_group = False
    obs.host_pid = pid
    try:
        if group is not None:
            if obs.in_group and group.reset_peak():
                obs.cgroup_base = group.usage()
            else:
                obs.in_group, obs.cgroup_base = False, 0
                group.add(obs.host_pid)
        with open(f"/proc/{obs.host_pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")                   # VmHWM := VmRSS
        obs.rss_at_ready = _status(obs.host_pid)["VmRSS"]
        obs.written = -_written(obs.host_pid)
    except (OSError, KeyError):
        return False
    return True


def at_done(obs: RankObservation, root: int, known: set[int], group=None) -> bool:
    """Read the rank's high-water mark, cgroup peak and written bytes; note processes nobody asked
    for (in the sandbox, and in the rank's cgroup: anything but the rank itself)."""
    if not AVAILABLE:
        return True
    if obs.host_pid is None:
        return False
    try:
        obs.hwm = _status(obs.host_pid)["VmHWM"]
        obs.written = (obs.written or 0) + _written(obs.host_pid)
        if group is not None:
            obs.cgroup_peak = max(0, group.peak() - obs.cgroup_base)
    except (OSError, KeyError, ValueError):
        return False
    obs.extra_processes = [p for p in descendants(root) if p not in known]
    if group is not None:
        obs.extra_processes += [p for p in group.procs() if p != obs.host_pid and p not in obs.extra_processes]
    return True


def excess_written(learner: list[RankObservation], trusted: list[RankObservation]) -> int:
    """Bytes the learner's ranks wrote beyond the trusted starter's same ranks (gloo's socket
    traffic counts in both; a tensor parked in a file or pipe only in the learner's)."""
    return max([(m.written or 0) - (b.written or 0) for m, b in zip(learner, trusted)] or [0])


def unexplained(obs: RankObservation, reported_peak: int, cgroup: bool | None = None) -> int | None:
    """Memory the learner's phase used beyond what its reported device peak explains: from the
    rank's cgroup where it had one (`cgroup` None: whenever it had), else from VmHWM."""
    if obs.device_at_ready is None:
        return None
    if cgroup is None:
        cgroup = obs.cgroup_peak is not None
    if cgroup:
        if obs.cgroup_peak is None:
            return None
        used = obs.cgroup_peak
    else:
        if None in (obs.hwm, obs.rss_at_ready):
            return None
        used = obs.hwm - obs.rss_at_ready
    return used - (int(reported_peak) - obs.device_at_ready)


def kernel_accounted(observations: list[RankObservation]) -> bool:
    """Every rank was measured by its own memory cgroup."""
    return bool(observations) and all(o.cgroup_peak is not None for o in observations)


def hidden_memory(learner: list[RankObservation], learner_peaks: list[int], trusted: list[RankObservation],
                  trusted_peaks: list[int]) -> tuple[int, int] | None:
    """(bytes the learner's run used beyond what it reported, allowed noise) for the worst rank,
    compared rank by rank with the trusted starter's same figure; None when nothing was observed.
    The learner hid memory when the first exceeds the second."""
    worst = None
    by_cgroup = kernel_accounted(learner) and kernel_accounted(trusted)   # the same reading on both sides
    for mine, my_peak, base, base_peak in zip(learner, learner_peaks, trusted, trusted_peaks):
        u_mine, u_base = unexplained(mine, my_peak, by_cgroup), unexplained(base, base_peak, by_cgroup)
        if u_mine is None or u_base is None:
            continue
        candidates = [(u_mine - u_base, max(TOLERANCE_BYTES, int(TOLERANCE_FRACTION * base_peak)))]
        if mine.nvml_peak and base.nvml_peak:          # on a GPU: the device memory itself
            candidates.append(((mine.nvml_peak - int(my_peak)) - (base.nvml_peak - int(base_peak)),
                               max(NVML_TOLERANCE_BYTES, int(NVML_TOLERANCE_FRACTION * base_peak))))
        for excess, allowed in candidates:
            if worst is None or excess - allowed > worst[0] - worst[1]:
                worst = (excess, allowed)
    return worst


def nvml_sampler(gpu: bool) -> "NvmlSampler | None":
    """A sampler on a GPU with NVML (the `gpu` extra: nvidia-ml-py), else None."""
    if not gpu:
        return None
    try:
        return NvmlSampler()
    except Exception:  # noqa: BLE001 - no NVML: the host-memory check still runs
        return None


class NvmlSampler:
    """On a GPU: the peak of NVML's per-process used device memory for some pids, sampled every
    20 ms by a thread of the parent (the learner cannot reach NVML's record of its process)."""

    def __init__(self, device_index: int = 0):
        import pynvml
        pynvml.nvmlInit()
        self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            except self._nvml.NVMLError:
                continue
            for p in procs:
                used = int(p.usedGpuMemory or 0)
                if used > self.peaks.get(p.pid, 0):
                    self.peaks[p.pid] = used

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks
