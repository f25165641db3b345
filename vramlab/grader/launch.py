"""Inside the sandbox: start one harness process per rank and wait for them.

    python -I -m vramlab.grader.launch JOB.json CTL_FD,STATUS_FD [CTL_FD,STATUS_FD ...]

The ranks of a 2-process exercise share this one sandbox (and its private loopback, for gloo);
each gets only its own pair of pipes to the parent. This process holds nothing the parent trusts.
A fresh sandbox per grading has a fresh IPC namespace already; this process only remounts the
writable folders noexec and drops the capability bwrap left it for that (confine.py).
"""
from __future__ import annotations

import os
import subprocess
import sys


def main(argv) -> int:
    job_path, pairs = argv[1], [tuple(int(fd) for fd in p.split(",")) for p in argv[2:]]
    if os.environ.pop("VRAMLAB_CONFINE", "") == "1":     # bwrap left us CAP_SYS_ADMIN for this (confine.py)
        from vramlab.grader import confine
        if not confine.remount_noexec(("/submission", "/tmp", "/dev/shm")):
            print("launch: could not remount the writable folders noexec", file=sys.stderr)
        if not confine.drop_capabilities():
            print("launch: could not drop capabilities", file=sys.stderr)
            return 3
    procs = []
    for rank, (ctl, status) in enumerate(pairs):
        procs.append(subprocess.Popen([sys.executable, "-I", "-B", "-X", "utf8", "-m", "vramlab.grader.harness",
                                       job_path, str(rank), str(ctl), str(status)], pass_fds=(ctl, status)))
    for ctl, status in pairs:
        os.close(ctl)
        os.close(status)
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
