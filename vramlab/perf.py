"""The project's measured figures and their history, in one file that benchmark commands append to.

    vramlab/data/perf/history.jsonl     one JSON object per measurement (append-only)

Each entry says what was measured, by which command, on what (machine, cores, load average,
torch version, commit) and when; `figures` holds the numbers, `note` anything a reader needs.
Benchmark commands append with `record(...)` when given `--record`; the site's performance page
(docs/dev/performance.md) is rendered from this file at build time (docs/hooks/performance.py),
so README and the guides never carry dated timings of their own.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

HISTORY = Path(__file__).resolve().parent / "data" / "perf" / "history.jsonl"


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HISTORY.parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cores": os.cpu_count(), "machine": platform.machine(), "system": platform.system(),
            "load_average": load, "torch": torch_version}


def record(benchmark: str, command: str, figures: dict, note: str = "", path: Path | None = None,
           commit: str | None = None) -> dict:
    """Append one measurement to the history; returns the entry. `commit`: the code measured,
    when it is not this checkout's HEAD (a before/after run on an older tree)."""
    entry = {"benchmark": benchmark, "command": command,
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "commit": commit or _commit(), "on": machine(), "figures": figures, "note": note}
    path = path or HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return entry


def history(path: Path | None = None) -> list[dict]:
    path = path or HISTORY
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
