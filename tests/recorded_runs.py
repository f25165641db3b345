"""Recorded grading runs: what the sandboxed children reported, replayed through the real grader.

tests/test_alternatives.py grades ~160 alternative submissions. Their children are deterministic
on the simulated device, so a run is recorded once (scripts/record_alternatives.py) and replayed:
`vramlab.grader.core.run_job` returns the recorded ChildRun, and everything after it (the checks of
core.py, the observer's comparison, the kind's judge) runs for real. A recording is used only
while it is current: its `code` key covers every file of the package that a grading child can run
(the static import closure of the warm worker, the harness, the kinds and the specs, as the
tutorials' freshness hash computes it), the package's data files, the Python version and the
versions of torch, transformers, peft and bitsandbytes; with the alternative file's own hash
(test_alternatives.py). Anything else makes the test grade live.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "tests" / "fixtures" / "alternatives"
# what a grading child runs: forked from the warm worker (worker.py) or started by launch.py, then
# harness -> kinds -> specs -> sim, models ...
CHILD_IMPORTS = "import vramlab.grader.launch\nimport vramlab.grader.worker\nimport vramlab.grader.harness\nimport vramlab.grader.kinds\nimport vramlab.exercises\n"


def code_key() -> str:
    """The tutorials' freshness hash (vramlab.tutorials.package_sha256: an import closure and the
    package's data files) of what a grading child imports, with the Python and library versions."""
    import importlib.metadata

    from vramlab.tutorials import package_sha256

    h = hashlib.sha256(package_sha256(CHILD_IMPORTS).encode())
    h.update(f"python {sys.version}".encode())
    for dist in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist} missing".encode())
    return h.hexdigest()


def file_sha(path: Path) -> str:
    """The alternative's own bytes: a recording answers for the file it was made from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_key(job, source: str) -> str:
    """One run: the job (its file's JSON) without what differs between honest runs of it (cores, a
    drawn case), and the source it ran."""
    comparable = {k: v for k, v in job.to_dict().items() if k not in ("threads", "case_seed")}
    text = json.dumps(comparable, sort_keys=True) + "\0" + source
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _to_json(run) -> dict:
    return dataclasses.asdict(run)


def _from_json(doc: dict):
    from vramlab.grader.observer import RankObservation
    from vramlab.grader.sandbox import ChildRun

    doc = dict(doc, observations=[RankObservation(**o) for o in doc.get("observations", [])])
    return ChildRun(**doc)


def path_for(exercise_id: str) -> Path:
    return RECORDINGS / f"{exercise_id}.json"


def load(exercise_id: str) -> dict | None:
    path = path_for(exercise_id)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@contextlib.contextmanager
def recording(table: dict[str, list], drawn: list | None = None):
    """Grade for real, adding every child's ChildRun to `table` under its run key; a run of a case
    drawn at grading time (ch02) is not recorded (it could never be replayed) but noted in `drawn`."""
    from vramlab.grader import core

    real, lock = core.run_job, threading.Lock()

    def run_job(job, source, *args, **kwargs):
        run = real(job, source, *args, **kwargs)
        if job.case_seed:
            if drawn is not None:
                drawn.append(job.function)
            return run
        with lock:
            table.setdefault(run_key(job, source), []).append(_to_json(run))
        return run

    core.run_job = run_job
    try:
        yield table
    finally:
        core.run_job = real


class NotRecorded(LookupError):
    pass


@contextlib.contextmanager
def replaying(table: dict[str, list]):
    """Serve every run from `table` (in turn, where one job ran twice); NotRecorded otherwise."""
    from vramlab.grader import core

    real, lock, served = core.run_job, threading.Lock(), {}

    def run_job(job, source, *args, **kwargs):
        if job.case_seed:
            raise NotRecorded("a drawn case")
        key = run_key(job, source)
        with lock:
            runs = table.get(key)
            if not runs:
                raise NotRecorded(key)
            i = served.get(key, 0)
            served[key] = i + 1
        return _from_json(runs[i % len(runs)])

    core.run_job = run_job
    try:
        yield
    finally:
        core.run_job = real
