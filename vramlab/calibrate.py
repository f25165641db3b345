"""Each H200 reference row on the simulated device (and on CUDA when there is one), side by side.

`vramlab calibrate` is the evidence that the simulated device is faithful: for every row it prints
the sim's steady peak over the H200's (and, on a GPU, the live CUDA peak over the H200's and the
sim's over the live GPU's). The sim runs under FakeTensorMode, so all rows take about a minute on
a laptop. On a GPU, commit the `--json` output with its provenance (vramlab/data/).
"""
from __future__ import annotations

import datetime
import platform

import torch

from .reference import reference_rows
from .runner import measure_workload
from .units import MiB
from .workload import from_reference_name


def calibrate(backends: str = "auto", rows: str | None = None) -> dict:
    if backends == "auto":
        backends = "sim,cuda" if torch.cuda.is_available() else "sim"
    chosen = backends.split(",")
    wanted = set(rows.split(",")) if rows else None
    report = {
        "date": datetime.date.today().isoformat(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.machine()})",
        "backends": chosen, "rows": [],
    }
    for ref in reference_rows():
        if wanted and ref.name not in wanted:
            continue
        w = from_reference_name(ref.name)
        row = {"name": ref.name, "h200_steady_mib": ref.steady_mib, "h200_first_step_mib": ref.first_step_mib,
               "h200_reserved_mib": ref.reserved_mib}
        for backend in chosen:
            m = measure_workload(w, backend=backend, fake=(backend == "sim"))
            row[f"{backend}_steady_mib"] = round(m.peak_bytes / MiB, 1)
            row[f"{backend}_first_step_mib"] = round(m.first_step_peak_bytes / MiB, 1)
            row[f"{backend}_reserved_mib"] = round(m.reserved_peak_bytes / MiB, 1)
            row[f"{backend}_over_h200"] = round(m.peak_bytes / MiB / ref.steady_mib, 4)
        if "sim" in chosen and "cuda" in chosen:
            row["sim_over_cuda"] = round(row["sim_steady_mib"] / row["cuda_steady_mib"], 4)
        report["rows"].append(row)
    for backend in chosen:
        ratios = [r[f"{backend}_over_h200"] for r in report["rows"]]
        if ratios:
            report[f"{backend}_worst_abs_error"] = round(max(abs(x - 1) for x in ratios), 4)
    return report


def print_report(report: dict):
    print(f"校准：{report['device']}，torch {report['torch']}，{report['date']}")
    cols = report["backends"]
    header = f"{'配置':<44}{'H200':>8}" + "".join(f"{b:>10}{b + '/H200':>11}" for b in cols)
    print(header)
    for r in report["rows"]:
        line = f"{r['name']:<44}{r['h200_steady_mib']:>8}"
        for b in cols:
            line += f"{r[b + '_steady_mib']:>10.0f}{r[b + '_over_h200']:>11.3f}"
        print(line)
    for b in cols:
        if f"{b}_worst_abs_error" in report:
            print(f"{b} 与 H200 的最大相对误差：{100 * report[b + '_worst_abs_error']:.1f}%（单位 MiB，稳态峰值）")
