"""Every exercise's judge on recorded runs (scripts/record_judged_runs.py): no process started.

The full tier grades the reference solutions and starters for real (tests/test_exercises*.py);
here the same verdicts come in milliseconds from what those children reported, so a change to a
judge or a target is checked in the daily loop (`make check`).
"""
import json
from pathlib import Path

import pytest

from vramlab.exercises import EXERCISES, get_exercise
from vramlab.grader.core import base_result, judge
from vramlab.grader.kinds import get_kind

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded"


def _judge(eid: str, which: str) -> dict:
    doc = json.loads((RECORDED / f"{eid}.json").read_text(encoding="utf-8"))
    spec = get_exercise(eid)
    bp, sp = doc["runs"]["baseline"]["payload"], doc["runs"][which]["payload"]
    assert bp["ok"] and not bp["violations"], bp.get("error")
    result = base_result(spec, doc["backend"], doc["scale"])
    result["baseline_peak_bytes"], result["baseline_step_seconds"] = bp.get("peak_bytes"), bp.get("step_seconds")
    if not sp.get("ok") or sp.get("violations"):                # what core._child_failed would say
        return dict(result, passed=False, category="failed_run", reason=str(sp.get("error") or sp.get("violations")))
    return judge(get_kind(spec.kind), spec, result, bp, sp)


def test_every_exercise_is_recorded():
    assert sorted(p.stem for p in RECORDED.glob("*.json")) == sorted(EXERCISES)


@pytest.mark.parametrize("eid", list(EXERCISES))
def test_recordings_are_of_the_current_spec(eid):
    """A recording of another scale, step count or setting judges nothing: re-record
    (scripts/record_judged_runs.py) after changing an exercise's ci scale."""
    import importlib.util

    from vramlab.grader.core import make_job

    path = Path(__file__).resolve().parent.parent / "scripts" / "record_judged_runs.py"
    module = importlib.util.spec_from_file_location("record_judged_runs", path)
    record = importlib.util.module_from_spec(module)
    module.loader.exec_module(record)
    doc = json.loads((RECORDED / f"{eid}.json").read_text(encoding="utf-8"))
    assert doc.get("job") == json.loads(json.dumps(record.comparable_job(make_job(get_exercise(eid), "ci", "sim")))), \
        f"{eid}: recorded for another job; run scripts/record_judged_runs.py {eid}"


@pytest.mark.parametrize("eid", list(EXERCISES))
def test_recorded_solution_passes(eid):
    r = _judge(eid, "solution")
    assert r["passed"] and r["category"] == "ok" and r["score"] == r["max_score"], r["reason"]


@pytest.mark.parametrize("eid", list(EXERCISES))
def test_recorded_starter_fails(eid):
    r = _judge(eid, "starter")
    assert not r["passed"] and r["score"] == 0 and r["category"] != "ok", r["reason"]
    assert any("\u4e00" <= ch <= "\u9fff" for ch in r["reason"])         # the learner reads why, in Chinese


@pytest.mark.parametrize("eid", list(EXERCISES))
def test_hidden_tests_accept_the_recorded_solution(eid):
    """The check cell's hidden tests (what `nbgrader validate` runs on the source notebook) hold for
    the reference's function and its judged result, for every exercise, and reject a failed one."""
    from vramlab.notebooks import check_source

    spec = get_exercise(eid)
    hidden = check_source(spec).split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS", 1)[0]
    ns: dict = {}
    exec(compile(spec.solution, f"<{eid} solution>", "exec"), ns)    # defines the function only
    exec(compile(hidden, f"<{eid} hidden tests>", "exec"), dict(ns, result=_judge(eid, "solution")))
    with pytest.raises(AssertionError):
        exec(compile(hidden, f"<{eid} hidden tests>", "exec"), dict(ns, result=_judge(eid, "starter")))
