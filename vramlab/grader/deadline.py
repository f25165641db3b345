"""A wall-clock deadline for a whole grading, enforced from outside the grading.

`run_job` (sandbox.py) bounds the ready/go/done conversation with the ranks by the exercise's time
limit, but a grading is more than that conversation: a warm sandbox may have to start, the
trusted starter may have to be measured, the hidden cases run one after the other, results are
read and judged. Anything there that waits on something a submission controls (a result file
turned into a FIFO, a submitted notebook that is a FIFO) would stall the grader, and one stalled
grading stalls a whole batch. So every entry point (`vramlab grade`, `vramlab.check()`, the
batch, nbgrader autograde) grades through `run(call, ...)`:

    deadline = (1 + hidden cases) x time limit + MARGIN_S        # or --deadline / $VRAMLAB_DEADLINE_S

A watchdog thread waits for it. When it passes:

1. the runs in flight in this process are killed (`sandbox.abort_all`): their processes die, so
   whatever the grading waits for on them (pipes, sockets, a warm-up) ends at once;
2. if the grading still has not returned GRACE_S later, the thread that grades is interrupted
   (a signal whose handler raises `Expired`: a blocking open() or read() ends with EINTR), where
   that thread is the main thread (signal handlers run only there);
3. the batch adds one more layer from its parent process: a pool worker whose grading passes the
   deadline by 3 x GRACE_S is killed with its whole process tree (batch.py).

The grading's outcome is then that submission's timeout: category "timeout", 0 points, a Chinese
reason, recorded like any other result; whatever the interrupted grading would have said (a crash,
a grader error because its runs were killed) is replaced by it. Step 1 kills every run of this
process, which is exact where a process grades one submission at a time (all four entry points);
where several gradings run at once in one process (threads), step 1 is skipped and each run ends
by its own time limit.
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time

ENV = "VRAMLAB_DEADLINE_S"
MARGIN_S = 300.0        # a sandbox's warm-up (slots.WARM_TIMEOUT_S) and the starter's runs on a loaded machine
GRACE_S = float(os.environ.get("VRAMLAB_DEADLINE_GRACE_S", "") or 10.0)
# a real-time signal nobody else uses (SIGALRM is pytest-timeout's and a learner's notebook's)
INTERRUPT = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGALRM", None)

_count_lock = threading.Lock()
_in_flight = 0


class Expired(BaseException):
    """Raised in the grading thread once its deadline has passed (a BaseException: the grader's
    `except Exception` around a learner's doing does not swallow it)."""


def from_env() -> float | None:
    """$VRAMLAB_DEADLINE_S in seconds, or None when unset; ValueError (Chinese) when it is not a
    finite number above 0."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"环境变量 {ENV} 必须是大于 0 的有限秒数，收到 {text!r}")
    return value


def seconds(exercise_id: str, scale: str = "ci", timeout_s: float | None = None, deadline_s: float | None = None) -> float:
    """The deadline of one grading: `deadline_s` (--deadline) if given, else $VRAMLAB_DEADLINE_S,
    else one time limit per case the submission runs (the visible one and each hidden one) plus
    MARGIN_S for everything around them."""
    if deadline_s:
        return float(deadline_s)
    configured = from_env()
    if configured:
        return configured
    from .core import DEFAULT_TIMEOUT

    limit = float(timeout_s or DEFAULT_TIMEOUT.get(scale, DEFAULT_TIMEOUT["ci"]))
    try:
        from ..exercises import get_exercise

        cases = 1 + len(getattr(get_exercise(exercise_id), scale).hidden)
    except (KeyError, AttributeError):
        cases = 1
    return cases * limit + MARGIN_S


def timeout_zh(limit: float) -> str:
    return (f"整份评分超过了总时限 {limit:.0f} 秒仍未结束（总时限 = 每个用例的运行时限 + 准备和比对的余量），"
            "评分器已从外部终止了它的全部进程，记 0 分。常见原因：死循环、每一步太慢，或者让评分器一直等待的文件"
            "（例如把提交或结果文件换成命名管道）")


def timeout_result(exercise_id: str, backend: str, scale: str, limit: float, seconds_used: float) -> dict:
    """The verdict of a grading stopped at its deadline, shaped like any other result."""
    from ..exercises import get_exercise
    from .core import base_result
    from .kinds.common import fail

    result = base_result(get_exercise(exercise_id), backend, scale)
    result.update(seconds=round(seconds_used, 2), deadline_s=round(limit, 1))
    return fail(result, "timeout", timeout_zh(limit))


def run(call, exercise_id: str, backend: str = "sim", scale: str = "ci", timeout_s: float | None = None,
        deadline_s: float | None = None) -> dict:
    """`call()` (a grading that returns its result dict) under the deadline (see the module doc):
    its result, or the timeout verdict once the deadline has passed. Exceptions of the grading
    itself (a GraderError) propagate unless the deadline had passed; stop signals always do."""
    limit = seconds(exercise_id, scale, timeout_s, deadline_s)
    t0 = time.monotonic()
    watch = _Watch(limit)
    try:
        with watch:
            result = call()
    except Expired:
        result = None
    except Exception:       # noqa: BLE001 - past the deadline, a failure of the killed runs is the timeout
        if not watch.expired:
            raise
    if not watch.expired:
        return result
    return timeout_result(exercise_id, backend, scale, limit, time.monotonic() - t0)


class _Watch:
    """The watchdog of one grading (steps 1 and 2 of the module doc)."""

    def __init__(self, limit: float):
        self.limit, self.expired, self.sent = limit, False, False
        self.done, self.lock = threading.Event(), threading.Lock()
        self.main = (threading.current_thread() is threading.main_thread() and INTERRUPT is not None
                     and hasattr(signal, "pthread_kill"))
        self.ident = threading.get_ident()

    def __enter__(self):
        global _in_flight
        with _count_lock:
            _in_flight += 1
        if self.main:
            self.old = signal.signal(INTERRUPT, self._on_signal)
        threading.Thread(target=self._watch, name="vramlab-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc) -> bool:
        global _in_flight
        with self.lock:             # from here on no signal is sent
            self.done.set()
        with _count_lock:
            _in_flight -= 1
        if self.main and not self.sent:
            # one sent may still be pending: the handler stays (a no-op once done) instead of the
            # default action, which would end the process
            signal.signal(INTERRUPT, self.old)
        return False

    def _on_signal(self, signum, frame) -> None:
        if self.expired and not self.done.is_set():
            raise Expired()

    def _watch(self) -> None:
        if self.done.wait(self.limit):
            return
        with self.lock:
            if self.done.is_set():
                return
            self.expired = True
        alone = _in_flight == 1
        for _ in range(3):
            if alone:               # also a run the grading started since the last round
                from . import sandbox

                sandbox.abort_all(wait_s=0)
            if self.done.wait(GRACE_S):
                return
            with self.lock:
                if self.done.is_set() or not self.main:
                    continue
                self.sent = True
                signal.pthread_kill(self.ident, INTERRUPT)


__all__ = ["ENV", "Expired", "from_env", "run", "seconds", "timeout_result", "timeout_zh"]
