"""The trusted starter's run, measured once and kept on disk.

Every learner of a class is compared with the same starter run: the same code, scale and backend
give the same figures. The run is kept under a key of everything that could change it (exercise,
scale, backend, sandbox, the job and the starter's code, the hash of the vramlab package, the
versions of Python, torch and transformers, the machine). A file that does not match its key, or
that does not parse into a complete successful run, is ignored and measured again, never trusted.

The folder is `$VRAMLAB_CACHE_DIR`, else `$XDG_CACHE_HOME/vramlab`, else `~/.cache/vramlab`; it
lives outside every sandbox, so learner code cannot write it. An instructor's batch and a
learner's `vramlab.check()` on one machine share it; `vramlab grade --fresh-baseline` ignores it.

The memory the parent observes of a process has some noise (observer.py). When a starter run is
measured for the cache it is measured twice, at the same time, and the run with the larger
unexplained memory is kept: an honest submission is never judged against a lucky low reading.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

from . import observer
from .sandbox import ChildRun

FORMAT = 1
_memory: dict[str, ChildRun] = {}


def cache_dir() -> Path:
    if os.environ.get("VRAMLAB_CACHE_DIR"):
        return Path(os.environ["VRAMLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vramlab"


def code_version() -> str:
    """The vramlab package's code (every .py file), the interpreter and the installed versions of
    torch, transformers, peft and bitsandbytes (slots.code_version: read without importing them),
    and the machine: what changes a measurement."""
    from .slots import code_version as worker_version

    return hashlib.sha256(f"{worker_version()}|{platform.machine()}|{FORMAT}".encode()).hexdigest()


def key(spec_id: str, scale: str, backend: str, sandboxed: bool, job, starter: str) -> str:
    material = json.dumps({"exercise": spec_id, "scale": scale, "backend": backend, "sandboxed": sandboxed,
                           "job": job.to_dict(), "starter": starter, "code": code_version()}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _path(k: str) -> Path:
    return cache_dir() / "baselines" / f"{k}.json"


def _to_json(run: ChildRun) -> dict:
    return dataclasses.asdict(run)


def _from_json(doc: dict) -> ChildRun | None:
    try:
        fields = dict(doc)
        fields["observations"] = [observer.RankObservation(**o) for o in fields.get("observations") or []]
        run = ChildRun(**fields)
    except (TypeError, ValueError):
        return None
    ok = (isinstance(run.payload, dict) and run.payload.get("ok") and not run.payload.get("violations")
          and not run.protocol_error and not run.timed_out)
    return run if ok else None


def load(k: str) -> ChildRun | None:
    """The kept run for key `k`, or None (absent, unreadable, another key's, or not a clean run)."""
    if k in _memory:
        return _memory[k]
    try:
        doc = json.loads(_path(k).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != k or doc.get("format") != FORMAT:
        return None
    run = _from_json(doc.get("run") or {})
    if run is not None:
        _memory[k] = run
    return run


def store(k: str, run: ChildRun) -> None:
    """Keep `run` (written to a temporary file and renamed: readers never see half a file)."""
    _memory[k] = run
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": FORMAT, "key": k, "run": _to_json(run)}, f)
        os.replace(tmp, path)
    except OSError:          # a read-only or full disk: the run is still kept for this process
        pass


def noisier(a: ChildRun, b: ChildRun) -> ChildRun:
    """Of two clean runs of the same starter, the one whose reported peak explains less of the
    memory the parent observed (the more generous comparison for the learner)."""
    def worst(run: ChildRun) -> int:
        values = [observer.unexplained(o, p) for o, p in zip(run.observations, run.rank_peaks)]
        return max([v for v in values if v is not None] or [0])
    return a if worst(a) >= worst(b) else b
