"""Record a workload's memory timeline on the simulated device (FakeTensorMode: seconds, no data).

The tracker already knows, for every storage, the op and module that created it and (by the end of
the run) its final category. We listen to each allocation and free on this one tracker instance,
then replay the events with the final categories, so the stacked timeline agrees with
`SimDevice.breakdown()` at the peak.
"""
from __future__ import annotations

import datetime

from .format import Event, build_trace

_PHASE_ZH = {"forward": "前向", "backward": "反向", "optimizer": "优化器 step"}


def _listen(tracker, log: list):
    """Log (record, delta, reserved) for every allocation and free of `tracker` (this instance only)."""
    track, release = tracker.track, tracker._release
    seen: set[int] = set()

    def tracked(t, func=None, label=None):
        rec = track(t, func, label)
        if rec is not None and id(rec) not in seen:
            seen.add(id(rec))
            log.append((rec, rec.charged, tracker.reserved()))
        return rec

    def released(key):
        rec = tracker.live.get(key)
        release(key)
        if rec is not None:
            log.append((rec, -rec.charged, tracker.reserved()))

    tracker.track, tracker._release = tracked, released


def record_workload(w, steps: int = 2, title: str | None = None, description: str = "") -> dict:
    """Trace `steps` training steps of workload `w` (model creation included) on SimDevice(fake=True)."""
    import torch

    from .. import __version__
    from ..runner import build_training
    from ..sim.device import SimDevice

    log: list = []
    step_starts = []
    dev = SimDevice(fake=True)
    with dev:
        _listen(dev.tracker, log)
        _model, _opt, step = build_training(w, dev)
        for _ in range(steps):
            step_starts.append(len(log))
            step()
    events = [Event(delta, rec.category, rec.op, rec.where, reserved) for rec, delta, reserved in log]
    marks: dict[int, list[str]] = {0: ["构建模型"]}
    for s, x in enumerate(step_starts):
        marks.setdefault(x, []).append(f"第 {s + 1} 步")
    last = None
    for i, (rec, delta, _) in enumerate(log):
        if delta > 0 and rec.phase in _PHASE_ZH and rec.phase != last and i >= step_starts[0]:
            marks.setdefault(i, []).append(_PHASE_ZH[rec.phase])
            last = rec.phase
    source = {"backend": "sim", "device": "CPU 上的模拟设备（FakeTensorMode）", "torch": torch.__version__,
              "vramlab": __version__, "date": datetime.date.today().isoformat(), "workload": w.to_dict(),
              "steps": steps, "measure": "已分配显存（与 max_memory_allocated 同口径）；reserved 为缓存分配器模型的已保留显存"}
    trace = build_trace(events, title=title or w.model, description=description, source=source,
                        marks=[(x, " · ".join(v)) for x, v in sorted(marks.items())])
    trace["source"]["max_allocated"] = dev.max_allocated()
    return trace
