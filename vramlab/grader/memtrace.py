"""Where the memory went, recorded inside a grading child for the learner's feedback.

The simulated device calls `tracker.timeline.append((allocated, reserved, label))` after every
allocation and free. `MemTrace` takes that place and keeps, while learner code runs, a bounded
picture of it: the lowest and highest allocated bytes per bucket of events (buckets double in
size when full, so a long run still fits in MAX_BUCKETS), each learner call's start, end and peak
exactly, the allocated bytes after every optimizer step, and, when the card overflows, where:
the step, the operator, the module, the learner's own line, and what was alive.

It runs in the learner's process, so everything it writes is a claim: good for feedback, never
for the verdict (the parent validates its shape in vramlab.grader.feedback and drops it when
malformed). No torch at import time: the harness imports it after torch, before learner code.
"""
from __future__ import annotations

import sys

MAX_BUCKETS = 100         # x 2 (lowest and highest) = at most 200 timeline points per run
MAX_CALLS = 64
MAX_STEPS = 200
TOP = 8                   # live tensors listed at the peak / at the overflow
TEXT = 160                # longest label kept
MAX_OOMS = 32
STATE = ("parameters", "gradients", "optimizer_state", "cuda_overhead")


def _short(s) -> str:
    s = str(s)
    return s if len(s) <= TEXT else s[:TEXT - 1] + "…"


class MemTrace:
    def __init__(self, dev, learner_file: str):
        self.tracker = dev.tracker
        # bound now, before learner code can rebind the device's methods
        self._breakdown, self._top = dev.breakdown, dev.top_allocations
        self._where, self._phase = dev.current_location, dev.phase
        self._budget = lambda: dev.budget
        self.learner_file = learner_file
        self.on = False
        self.n = 0                              # events seen while learner code ran
        self.shift = 0                          # event n falls in bucket n >> shift
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.lo_at: list[int] = []
        self.hi_at: list[int] = []
        self.calls: list[list] = []             # [start, end, allocated at start, at end, peak, peak event]
        self.steps: list[list[int]] = []        # [event, allocated] after each optimizer step
        self.oom: dict | None = None
        self.ooms: list[list[int]] = []         # [event, allocated] of every overflow (ch13 catches them)
        self.before: set | None = None          # storages alive when the first learner call began
        self.source_lines: list[str] = []
        self.tracker.timeline = self
        self.tracker.keep_timeline = True
        original = dev.out_of_memory

        def out_of_memory(request):             # the tracker raises what this returns
            try:
                self._overflow(int(request))
            except Exception:  # noqa: BLE001 - feedback must never change what the learner's code sees
                pass
            return original(request)
        dev.out_of_memory = out_of_memory
        import torch.optim.optimizer as optim_hooks
        self._hook = optim_hooks.register_optimizer_step_post_hook(self._stepped)

    def close(self) -> None:
        """Remove the optimizer hook (a grading child never needs to: it ends; tests do)."""
        self._hook.remove()

    # -- what the tracker calls ------------------------------------------------------------------
    def append(self, item) -> None:
        if not self.on:
            return
        a, n = item[0], self.n
        self.n = n + 1
        call = self.calls[-1]
        if a > call[4]:
            call[4], call[5] = a, n
        hi = self.hi
        b = n >> self.shift
        if b == len(hi):
            if b == MAX_BUCKETS:
                self._halve()
                hi, b = self.hi, b >> 1
            hi.append(a), self.lo.append(a), self.hi_at.append(n), self.lo_at.append(n)
        elif a > hi[b]:
            hi[b], self.hi_at[b] = a, n
        elif a < self.lo[b]:
            self.lo[b], self.lo_at[b] = a, n

    def __iter__(self):          # SimDevice.snapshot() iterates its timeline: nothing kept here
        return iter(())

    def __len__(self) -> int:
        return 0

    def _halve(self) -> None:
        """Merge neighbouring buckets: keep each pair's lowest and highest point."""
        lo, hi, lo_at, hi_at = self.lo, self.hi, self.lo_at, self.hi_at
        keep_lo = [i if lo[i] <= lo[i + 1] else i + 1 for i in range(0, len(lo), 2)]
        keep_hi = [i if hi[i] >= hi[i + 1] else i + 1 for i in range(0, len(hi), 2)]
        self.lo, self.lo_at = [lo[i] for i in keep_lo], [lo_at[i] for i in keep_lo]
        self.hi, self.hi_at = [hi[i] for i in keep_hi], [hi_at[i] for i in keep_hi]
        self.shift += 1

    # -- what the harness calls ------------------------------------------------------------------
    def around(self, call):
        """`call` (the harness's runner of learner code) with this call's start and end marked."""
        def marked(*args, **kwargs):
            if len(self.calls) < MAX_CALLS:
                a = self.tracker.allocated
                # [start, end, allocated at start, at end, peak, peak event, finished, carried in, carried out]
                self.calls.append([self.n, self.n, a, a, a, self.n, 0, self._carried(), 0])
                self.on = True
            ok = False
            try:
                value = call(*args, **kwargs)
                ok = True
                return value
            finally:
                if self.on:
                    self.on = False
                    c = self.calls[-1]
                    c[1], c[3], c[6] = self.n, self.tracker.allocated, int(ok)
                    c[8] = self._carried() if ok else 0     # a failed call's frames still hold its tensors
        return marked

    def _carried(self) -> int:
        """Live bytes created by learner calls that are not model state (parameters, gradients,
        optimizer state) nor cuBLAS workspaces: what one call hands to the next. What was alive
        before the first call (the model, the batches) does not count. Steady training carries 0."""
        live = self.tracker.live
        if self.before is None:
            self.before = set(live)
            return 0
        before = self.before
        return int(sum(r.charged for k, r in live.items() if k not in before and r.category not in STATE))

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self.on and len(self.steps) < MAX_STEPS:
            self.steps.append([self.n, self.tracker.allocated])

    def _overflow(self, request: int) -> None:
        """The card is full: remember where (the frames are still there) and what is alive."""
        op, line, function = "", 0, ""
        frame, depth = sys._getframe(1), 0
        while frame is not None and depth < 400:
            code = frame.f_code
            if not op and code.co_name in ("track", "resized"):
                func = frame.f_locals.get("func")
                op = (getattr(func, "__name__", None) or str(func)) if func is not None else "resize_"
            if code.co_filename == self.learner_file:
                line, function = frame.f_lineno, code.co_name
                break
            frame, depth = frame.f_back, depth + 1
        del frame
        if len(self.ooms) < MAX_OOMS:
            self.ooms.append([self.n, int(self.tracker.allocated)])
        live = self._breakdown(at_peak=False)
        self.oom = {"call": len(self.calls), "optimizer_steps": len(self.steps), "event": self.n,
                    "op": _short(op), "module": _short(self._where()), "phase": _short(self._phase()),
                    "line": int(line), "function": _short(function), "request": request,
                    "allocated": int(self.tracker.allocated), "capacity": int(self._budget() or 0),
                    "breakdown": {k: int(v) for k, v in live.items()},
                    "top": self._tops(at_peak=False)}

    def _tops(self, at_peak: bool) -> list[dict]:
        return [{"bytes": int(t["bytes"]), "op": _short(t["op"]), "where": _short(t["where"]),
                 "category": _short(t["category"])} for t in self._top(TOP, at_peak=at_peak)]

    def summary(self) -> dict | None:
        """The payload's `memory` field (None when no learner code ran on the device)."""
        if not self.calls:
            return None
        # x in half events: the point after event n is at 2n + 1, the boundary before it at 2n
        points = {2 * n + 1: a for n, a in zip(self.lo_at, self.lo)}
        points.update((2 * n + 1, a) for n, a in zip(self.hi_at, self.hi))
        calls = []
        for start, end, a0, a1, top, at, ok, carried_in, carried_out in self.calls:
            peak_x = 2 * at + 1 if top > a0 else 2 * start       # a call that never rose peaks where it began
            points[2 * start], points[peak_x], points[2 * end] = a0, top, a1
            calls.append([2 * start, 2 * end, int(a0), int(a1), int(top), peak_x, ok, carried_in, carried_out])
        peak = int(self.tracker.peak)
        peak_call = next((i for i in range(len(self.calls) - 1, -1, -1) if self.calls[i][4] == peak), None)
        oom = self.oom
        if oom is not None:
            line = oom["line"]
            oom["code"] = _short(self.source_lines[line - 1].strip()) if 0 < line <= len(self.source_lines) else ""
            oom["x"] = 2 * oom.pop("event")
        return {"events": self.n, "points": [[x, int(points[x])] for x in sorted(points)],
                "calls": calls, "steps": [[2 * n, int(a)] for n, a in self.steps],
                "ooms": [[2 * n, a] for n, a in self.ooms],
                "peak": peak, "peak_call": peak_call, "peak_label": _short(self.tracker.peak_where),
                "breakdown": {k: int(v) for k, v in self._breakdown().items()}, "top": self._tops(at_peak=True),
                "capacity": int(self._budget() or 0), "oom": oom}
