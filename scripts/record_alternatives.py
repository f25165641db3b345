"""Record the grading children of tests/alternatives/ for tests/test_alternatives.py to replay.

    .venv/bin/python scripts/record_alternatives.py [EXERCISE ...]   # writes tests/fixtures/alternatives/<id>.json

Each exercise's alternatives are graded for real (ci scale, simulated device, in the OS sandbox),
starting from an empty starter cache so that the trusted starter's runs are recorded too. Run it
after changing anything a grading child runs (the file's `code` key then no longer matches and the
tests grade live, slowly but correctly). Two processes at once on two cores:
`VRAMLAB_GRADE_CORES=1 ... A B C & VRAMLAB_GRADE_CORES=1 ... D E F`.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ["VRAMLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="vramlab-record-")    # every starter measured here

import recorded_runs  # noqa: E402


def record(exercise: str, paths: list[Path]) -> dict:
    import torch

    from vramlab.grader import policy
    from vramlab.grader.core import grade_file

    table: dict[str, list] = {}
    verdicts, sources = {}, {}
    for path in paths:
        drawn: list = []
        with recorded_runs.recording(table, drawn):
            r = grade_file(exercise, path, reuse_baseline=True)
        verdicts[path.stem] = r["category"]
        if not drawn:                         # every run of this grading can be replayed
            sources[path.stem] = recorded_runs.file_sha(path)
    return {"exercise": exercise, "code": recorded_runs.code_key(), "torch": torch.__version__,
            "sandboxed": policy.bwrap_path() is not None, "recorded": datetime.date.today().isoformat(),
            "verdicts": verdicts, "sources": sources, "runs": table}


def main(argv) -> int:
    from vramlab.exercises import EXERCISES

    alternatives: dict[str, list[Path]] = {}
    for p in sorted((ROOT / "tests" / "alternatives").glob("*/*.py")):
        alternatives.setdefault(p.parent.name, []).append(p)
    wanted = argv[1:] or sorted(alternatives)
    unknown = [e for e in wanted if e not in EXERCISES]
    if unknown:
        print(f"unknown exercise: {', '.join(unknown)}", file=sys.stderr)
        return 2
    recorded_runs.RECORDINGS.mkdir(parents=True, exist_ok=True)
    for exercise in wanted:
        doc = record(exercise, alternatives.get(exercise, []))
        recorded_runs.path_for(exercise).write_text(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n",
                                                    encoding="utf-8")
        print(f"{exercise}: {len(doc['runs'])} runs recorded ({doc['verdicts']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
