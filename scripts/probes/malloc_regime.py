"""Probe behind vramlab.grader.policy.cache_freed_memory: what the sandbox's malloc settings cost.

    .venv/bin/python scripts/probes/malloc_regime.py [EXERCISE ...]     (default: ch07-checkpoint)

sandbox_env() starts every grading process with MALLOC_MMAP_THRESHOLD_=65536 and
MALLOC_TRIM_THRESHOLD_=0, so that its resident size follows the live tensors (the observer reads
it), and THP_MEM_ALLOC_ENABLE=1 (run with THP_MEM_ALLOC_ENABLE=0 to see what that one saves).
Each buffer of 64 KiB or more is then mmapped, faulted in and zeroed page by page, and unmapped
on free. This runs the exercise's reference, visible case, in a forked child of a warm
process (as the grader's worker does) under those settings and again after cache_freed_memory(),
and prints user and system CPU seconds and minor page faults of each run.
"""
import json
import os
import sys
import tempfile

from vramlab.grader.policy import sandbox_env

FLAGS = {k: v for k, v in sandbox_env().items() if k.startswith("MALLOC_") or k == "THP_MEM_ALLOC_ENABLE"}


def child(exercise: str, cached: bool, wait_for=None) -> None:
    """In a forked child: the reference's visible case through harness.main, then exit (or call
    `wait_for(fd, word)` where the harness waits for its parent: the run is over at b"never")."""
    from vramlab.exercises import get_exercise
    from vramlab.grader import core, harness, policy

    if cached:
        policy.cache_freed_memory()
    spec = get_exercise(exercise)
    folder = tempfile.mkdtemp(prefix="vramlab-probe-")
    with open(f"{folder}/submission.py", "w", encoding="utf-8") as f:
        f.write(spec.solution)
    job = core.make_job(spec, "ci", "sim", 1).with_(reference=False, source_file=f"{folder}/submission.py",
                                                    init_method="tcp://127.0.0.1:29577")
    with open(f"{folder}/job.json", "w", encoding="utf-8") as f:
        json.dump(job.to_dict(), f)
    harness._wait_for = wait_for or (lambda fd, word: os._exit(0) if word == b"never" else None)
    ctl, status = os.pipe()
    harness.main(["harness", f"{folder}/job.json", "0", str(ctl), str(status)])


def main(exercises: list[str]) -> None:
    if any(os.environ.get(k) != v for k, v in FLAGS.items()):       # glibc reads them at start-up
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **FLAGS})
    from vramlab.grader import worker

    worker.warm_up()
    for exercise in exercises:
        for cached in (False, True):
            pid = os.fork()
            if pid == 0:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                child(exercise, cached)
                os._exit(0)
            _, _, usage = os.wait4(pid, 0)
            print(f"{exercise:22} {'cache_freed_memory()' if cached else 'sandbox malloc settings':24} "
                  f"user {usage.ru_utime:5.2f} s  system {usage.ru_stime:5.2f} s  minor faults {usage.ru_minflt:7d}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["ch07-checkpoint"])
