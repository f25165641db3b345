"""The H200 reference table (vramlab/data/h200_gpt2_peaks.md), parsed.

Measured 2026-11-29 on one NVIDIA H200 with PyTorch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0
(see the file's header for the method). Rows are keyed by configuration name; the name encodes
the workload (vramlab.workload.from_reference_name).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_ROW = re.compile(r"^\|\s*(\w[\w.]*)\s*(?:\([^)]*\))?\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d,]+)\s*\|")


@dataclass(frozen=True)
class ReferenceRow:
    name: str
    steady_mib: int
    first_step_mib: int
    reserved_mib: int
    step_ms: float
    trainable_params: int


def reference_text() -> str:
    return resources.files("vramlab").joinpath("data/h200_gpt2_peaks.md").read_text(encoding="utf-8")


def reference_rows() -> list[ReferenceRow]:
    rows = []
    for line in reference_text().splitlines():
        m = _ROW.match(line)
        if m:
            name, steady, first, reserved, ms, params = m.groups()
            rows.append(ReferenceRow(name, int(steady), int(first), int(reserved), float(ms),
                                     int(params.replace(",", ""))))
    return rows
