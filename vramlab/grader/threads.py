"""How many torch threads a grading runs with: the cores it may use that nothing else keeps busy.

The CI-scale models are tiny, so most of a step is many small operators. OpenMP threads that wait
for each other spin; when another process holds one of "their" cores, every operator waits for
the descheduled thread and a step takes several times longer (issue 33 measured ch05 at 26 s with
2 threads against 2.0 s with 1 under a load of 2 on 2 cores). So a grading asks the kernel how
many tasks are runnable right now and takes only the cores left over, at least one:

* `usable_cores()`: $VRAMLAB_GRADE_CORES when set (tests, benchmarks: a fixed count, no load
  check), else $SLURM_CPUS_PER_TASK when set, else this process's affinity mask;
* `busy_cores()`: the other tasks runnable on those cores now (the 4th field of /proc/loadavg,
  sampled a few times over a few milliseconds, median, minus this process), scaled to our share
  of the machine when the affinity mask is smaller than the machine;
* `torch_threads(world, share)`: the free cores of `share` (default all usable) divided among the
  ranks, between 1 and MAX_THREADS.
"""
from __future__ import annotations

import os
import statistics
import time

MAX_THREADS = 4          # the small CI-scale models gain little from more
SAMPLES, SAMPLE_GAP_S = 3, 0.001      # ~2 ms (one snapshot of the run queue is noisy); paid by every job a grading makes


def configured_cores() -> int | None:
    """$VRAMLAB_GRADE_CORES: a fixed count set by whoever runs the grading (no load check)."""
    configured = os.environ.get("VRAMLAB_GRADE_CORES", "")
    return int(configured) if configured.isdigit() and int(configured) > 0 else None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores() -> int:
    """The cores one grading may use: $VRAMLAB_GRADE_CORES when set (the test suite runs several
    gradings at once and gives each its share), else a Slurm job's cores per task, else the cores
    this process may run on (its affinity mask, not the machine's count)."""
    configured = configured_cores()
    if configured:
        return configured
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return min(int(slurm), _affinity())
    return _affinity()


def _runnable() -> int | None:
    """Tasks the kernel has runnable right now, machine-wide (this one included); None off Linux."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def busy_cores(cores: int | None = None) -> int:
    """How many of `cores` (default: the usable ones) other runnable tasks keep busy right now."""
    cores = cores or usable_cores()
    samples = []
    for i in range(SAMPLES):
        n = _runnable()
        if n is None:
            return 0
        samples.append(n - 1)                          # this process is running while it reads
        if i + 1 < SAMPLES:
            time.sleep(SAMPLE_GAP_S)
    others = statistics.median(samples)
    machine = os.cpu_count() or cores
    if machine > cores:                                # a share of a bigger machine: its share of the load
        others = others * cores / machine
    return min(cores, int(round(others)))


def free_cores(share: int | None = None) -> int:
    """The cores of `share` (default: all usable) not busy with other work, at least 1. A count
    set in $VRAMLAB_GRADE_CORES is taken as it is."""
    cores = share or usable_cores()
    if configured_cores():
        return cores
    return max(1, cores - busy_cores(cores))


def torch_threads(world: int, share: int | None = None) -> int:
    """Torch threads per rank of one grading: the free cores of `share` (default: all this process
    may use) divided among the ranks."""
    return max(1, min(MAX_THREADS, free_cores(share) // max(1, world)))
