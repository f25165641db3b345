"""Convert a CUDA allocator snapshot (torch.cuda.memory._snapshot()) into a vramlab trace.

On a GPU:

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    ...  # the steps to look at
    torch.cuda.memory._dump_snapshot("snapshot.pickle")     # a pickled _snapshot() dict
    # then: vramlab trace --from-cuda-snapshot snapshot.pickle --out my-trace.json

The pickle can't be read by a browser, so the website's viewer takes this JSON instead.
Replayed actions (device_traces[0], see the Snapshot docstring in torch/cuda/memory.py):
"alloc" adds a block, "free_completed" removes it (or "free_requested" when the trace has no
completions), "segment_alloc"/"segment_free" move the reserved line. Memory allocated before
recording started is the snapshot's active blocks minus the trace's net change. The allocator
does not know what a tensor is for, so every block is "unknown"; the op/module at the peak is the
innermost Python frame outside torch.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from .format import Event, build_trace


def load_snapshot(path: str | Path) -> dict:
    """Read a `_dump_snapshot` pickle (only open files you trust: pickle can run code)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def _where(frames: list[dict]) -> tuple[str, str]:
    """(op, module): the innermost Python frame outside torch's own files, and its function."""
    py = [f for f in frames or [] if str(f.get("filename", "")).endswith(".py")]
    for f in py:
        name = str(f["filename"]).replace("\\", "/")
        if "/torch/" not in name:
            return f.get("name", "?"), f"{name.rsplit('/', 1)[-1]}:{f.get('line', '?')}"
    if py:
        return py[0].get("name", "?"), f"{str(py[0]['filename']).rsplit('/', 1)[-1]}:{py[0].get('line', '?')}"
    return "alloc", "-"


def from_snapshot(snap: dict, device: int = 0, title: str = "CUDA 分配器快照", description: str = "") -> dict:
    """The trace of `snap["device_traces"][device]`."""
    traces = snap.get("device_traces") or []
    entries = traces[device] if device < len(traces) else []
    segments = [s for s in snap.get("segments", []) if s.get("device", device) == device]
    actions = {e.get("action") for e in entries}
    free_action = "free_completed" if "free_completed" in actions else "free_requested"
    allocated_end = sum(b["size"] for s in segments for b in s.get("blocks", []) if b.get("state") == "active_allocated")
    reserved_end = sum(s.get("total_size", 0) for s in segments)
    net = sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in entries
              if e.get("action") in ("alloc", free_action))
    seg_net = sum(e["size"] if e["action"] == "segment_alloc" else -e["size"] for e in entries
                  if e.get("action") in ("segment_alloc", "segment_free"))
    before = max(0, allocated_end - net)
    reserved = max(0, reserved_end - seg_net)
    events, where_of = [], {}
    for e in entries:
        action = e.get("action")
        if action in ("segment_alloc", "segment_free"):
            reserved += e["size"] if action == "segment_alloc" else -e["size"]
        elif action == "alloc":
            op, module = _where(e.get("frames"))
            where_of[e["addr"]] = (op, module)
            events.append(Event(e["size"], "unknown", op, module, reserved))
        elif action == free_action:
            known = where_of.pop(e.get("addr"), None)   # None: allocated before recording started
            op, module = known or _where(e.get("frames"))
            events.append(Event(-e["size"], "unknown" if known else "before_trace", op, module, reserved))
    source = {"backend": "cuda", "device": f"CUDA 设备 {device}（来自 torch.cuda.memory._snapshot()）",
              "measure": "缓存分配器的已分配 / 已保留显存"}
    return build_trace(events, title=title, description=description, source=source,
                       initial={"before_trace": before} if before else None)
