"""Record what the graded children report for every exercise: the fast tier judges these.

    .venv/bin/python scripts/record_judged_runs.py [IDS...]     # writes tests/fixtures/recorded/<id>.json

For each exercise (ci scale, simulated device, in the OS sandbox when there is one): the trusted
starter's payload, the reference solution's and the starter's again as a submission, each from a
real run of the harness. tests/test_judges_recorded.py then runs every kind's judge on them with no
process started: the solution passes, the starter fails. Re-record after changing what the
harness reports (the payload's fields); the judges themselves can change freely.
"""
from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "recorded"


def comparable_job(job) -> dict:
    """The job without what may differ between two honest runs (this machine's cores, the hidden
    case drawn for one grading): tests/test_judges_recorded.py compares it with the current spec's."""
    return {k: v for k, v in job.to_dict().items() if k not in ("threads", "case_seed")}


def record(spec) -> dict:
    import torch

    from vramlab.grader import policy
    from vramlab.grader.core import DEFAULT_MEMORY, DEFAULT_TIMEOUT, make_job
    from vramlab.grader.sandbox import run_job

    job = make_job(spec, "ci", "sim")
    sandboxed = policy.bwrap_path() is not None
    runs = {}
    for name, source, reference in (("baseline", spec.starter, True), ("solution", spec.solution, False),
                                    ("starter", spec.starter, False)):
        run = run_job(job.with_(reference=reference), source, DEFAULT_TIMEOUT["ci"], DEFAULT_MEMORY["ci"],
                      use_sandbox=sandboxed)
        if run.payload is None:
            raise RuntimeError(f"{spec.id} {name}: no result ({run.stderr_tail[-500:]})")
        runs[name] = {"payload": run.payload, "rank_peaks": run.rank_peaks}
    return {"exercise": spec.id, "kind": spec.kind, "scale": "ci", "backend": "sim", "sandboxed": sandboxed,
            "job": comparable_job(job),
            "torch": torch.__version__, "recorded": datetime.date.today().isoformat(), "runs": runs}


def main(argv) -> int:
    from vramlab.exercises import EXERCISES

    OUT.mkdir(parents=True, exist_ok=True)
    for spec in EXERCISES.values():
        if argv[1:] and spec.id not in argv[1:]:
            continue
        doc = record(spec)
        (OUT / f"{spec.id}.json").write_text(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{spec.id}: recorded", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
