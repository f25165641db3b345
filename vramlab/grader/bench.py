"""Grade every exercise's reference solution once and report seconds per exercise.

    python -m vramlab.grader.bench [--json] [--starters]     # or: vramlab grade-bench
"""
from __future__ import annotations

import argparse
import json
import time


def run(as_json: bool = False, scale: str = "ci", measure_starters: bool = False, backend: str = "sim",
        only: list[str] | None = None, sandbox: str = "auto") -> list[dict]:
    from ..exercises import EXERCISES
    from .core import grade_source

    rows = []
    for spec in EXERCISES.values():
        if only and spec.id not in only:
            continue
        kinds = [("solution", spec.solution)] + ([("starter", spec.starter)] if measure_starters else [])
        for kind, src in kinds:
            t0 = time.perf_counter()
            r = grade_source(spec.id, src, backend=backend, scale=scale, sandbox=sandbox)
            rows.append({"exercise": spec.id, "kind": spec.kind, "code": kind, "passed": r["passed"], "category": r["category"],
                         "seconds": round(time.perf_counter() - t0, 2), "peak_bytes": r["peak_bytes"],
                         "baseline_peak_bytes": r["baseline_peak_bytes"], "ratio": r["ratio"],
                         "target_ratio": spec.target_ratio, "reason": r["reason"], "loss_max_rel_err": r["loss_max_rel_err"],
                         "update_rel_err": r["update_rel_err"], "sandboxed": r.get("sandboxed"),
                         "observed_excess_bytes": r.get("observed_excess_bytes")})
            if not as_json:
                row = rows[-1]
                mib = (row["peak_bytes"] or 0) / 2**20
                base = (row["baseline_peak_bytes"] or 0) / 2**20
                ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "  -  "
                excess = row["observed_excess_bytes"]
                seen = f"{excess / 2**20:+6.1f} MiB" if excess is not None else "    -    "
                print(f"{spec.id:<22} {kind:<8} {'通过' if row['passed'] else '未通过':<4} 峰值 {mib:8.1f} MiB  "
                      f"起始 {base:8.1f} MiB  比值 {ratio}  目标 {spec.target_ratio:.2f}  进程外读数差 {seen}  "
                      f"耗时 {row['seconds']:.1f} s", flush=True)
    if as_json:
        print(json.dumps(rows, ensure_ascii=False))
    elif rows:
        secs = sorted(r["seconds"] for r in rows)
        excesses = [abs(r["observed_excess_bytes"]) for r in rows if r["observed_excess_bytes"] is not None]
        print(f"共 {len(rows)} 次评分：中位数 {secs[len(secs) // 2]:.1f} s，最长 {secs[-1]:.1f} s；"
              f"进程外读数与起始代码之差的最大绝对值 {max(excesses, default=0) / 2**20:.1f} MiB"
              f"（沙箱：{'是' if rows[0]['sandboxed'] else '否'}）")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m vramlab.grader.bench")
    p.add_argument("--json", action="store_true")
    p.add_argument("--scale", default="ci")
    p.add_argument("--starters", action="store_true")
    p.add_argument("--only", help="逗号分隔的练习编号")
    p.add_argument("--no-sandbox", action="store_true")
    a = p.parse_args(argv)
    run(as_json=a.json, scale=a.scale, measure_starters=a.starters, only=a.only.split(",") if a.only else None,
        sandbox="off" if a.no_sandbox else "auto")


if __name__ == "__main__":
    main()
