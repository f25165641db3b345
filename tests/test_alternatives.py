"""Other correct ways to do an exercise pass too, with room to spare; near misses do not.

tests/alternatives/<exercise-id>/<name>.py is a submission for that exercise whose first line says
what the grader must make of it: `# expect: pass`, or `# expect: CATEGORY` (alternatives separated
by `|`) for a counter-example that must fail with that reason category. A passing alternative must
land at least 10% inside the target (ratio <= 0.9 x target_ratio): a technique that only just passes
on the simulated device would fail for a learner whose numbers differ a little.

Two tiers. Where the alternative's recording is current (tests/fixtures/alternatives/, made by
scripts/record_alternatives.py; tests/recorded_runs.py says what "current" covers: the file itself,
everything a grading child runs, the library versions), its children's runs are replayed through
the real grader and judged in the fast tier (`make check`, no process started). Every other
alternative (no recording, an out-of-date one, or an exercise that draws its cases at grading time,
ch02) is graded live in the full tier. Re-record after changing the grader or the simulated device:
`.venv/bin/python scripts/record_alternatives.py [EXERCISE ...]`.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import recorded_runs
from vramlab.grader.core import GraderError, grade_file

ROOT = Path(__file__).resolve().parent.parent
ALTERNATIVES = sorted((ROOT / "tests" / "alternatives").glob("*/*.py"))
MARGIN = 0.9
# exercise id -> why its alternatives may land inside the margin
THIN_MARGIN: dict[str, str] = {
    "ch08-allreduce": "the task allows a fixed small communication buffer; one kept alive through optimizer.step() "
                      "adds its size to the step's peak, and the ci model's gradients are only 3.4 MiB: a 256 KiB "
                      "buffer lands at 0.85 of the 0.93 target (one_bucket_alive_at_step), an in-place all-reduce at 0.83",
}
CODE_KEY = recorded_runs.code_key()
_RECORDINGS = {e: recorded_runs.load(e) for e in {p.parent.name for p in ALTERNATIVES}}


def _recording(path: Path) -> dict | None:
    """The exercise's recording, if it is current for this alternative."""
    doc = _RECORDINGS.get(path.parent.name)
    if doc and doc.get("code") == CODE_KEY and doc.get("sources", {}).get(path.stem) == recorded_runs.file_sha(path):
        return doc
    return None


RECORDED = [p for p in ALTERNATIVES if _recording(p)]
LIVE = [p for p in ALTERNATIVES if not _recording(p)]


def test_code_key_covers_what_a_grading_child_runs():
    from vramlab.tutorials import PACKAGE, import_closure

    files = {p.relative_to(PACKAGE).as_posix() for p in import_closure(recorded_runs.CHILD_IMPORTS)}
    for runs in ("grader/worker.py", "grader/launch.py", "grader/harness.py", "grader/guards.py",
                 "grader/kinds/train_step.py", "sim/tracker.py", "sim/emulation.py", "models.py", "exercises/spec.py"):
        assert runs in files, runs
    for never in ("cli.py", "plan.py", "hosted.py", "evidence.py", "grader/bench.py"):
        assert never not in files, never       # changing these must not make the recordings stale


def _ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def _expect(path: Path) -> set[str]:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect:"), path
    allowed = {c.strip() for c in first.split(":", 1)[1].split("|") if c.strip()}
    assert allowed, path
    return allowed


def test_alternatives_cover_the_exercises():
    """Each exercise has a correct alternative that passes, a counter-example that must not (the
    obvious line copied into the wrong place, or a half fix), and, where hidden variations exist,
    a solution fitted to the visible case (`fitted*.py`) that the hidden case fails."""
    from vramlab.exercises import EXERCISES

    by_exercise: dict[str, dict[str, set[str]]] = {}
    for p in ALTERNATIVES:
        by_exercise.setdefault(p.parent.name, {})[p.stem] = _expect(p)
    missing = []
    for exercise, spec in EXERCISES.items():
        files = by_exercise.get(exercise, {})
        if not any("pass" in e for e in files.values()):
            missing.append(f"{exercise}: no correct alternative")
        if not any("pass" not in e for n, e in files.items() if not n.startswith("fitted")):
            missing.append(f"{exercise}: no counter-example")
        if spec.ci.hidden and not any("pass" not in e for n, e in files.items() if n.startswith("fitted")):
            missing.append(f"{exercise}: no solution fitted to the visible case")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("path", RECORDED, ids=_ids(RECORDED))
def test_alternative_on_its_recorded_runs(path):
    """The recorded children through the real grader (the sandbox off: nothing is started)."""
    try:
        with recorded_runs.replaying(_recording(path)["runs"]):
            r = grade_file(path.parent.name, path, reuse_baseline=False, sandbox="off")
    except GraderError as e:
        if isinstance(e.__cause__, recorded_runs.NotRecorded):
            pytest.fail(f"a run of {path.stem} is missing from its current recording: re-record "
                        f"(scripts/record_alternatives.py {path.parent.name})")
        raise
    _check(path, r)


@pytest.mark.slow
@pytest.mark.parametrize("path", LIVE, ids=_ids(LIVE))
def test_alternative_graded_live(path):
    warnings.warn(f"{path.parent.name}/{path.stem} graded live: no current recording "
                  "(scripts/record_alternatives.py)")
    _check(path, grade_file(path.parent.name, path, reuse_baseline=True))     # one trusted starter run per exercise


def _check(path: Path, r: dict) -> None:
    from vramlab.exercises import get_exercise

    get_exercise(path.parent.name)                  # the folder names a real exercise
    expected = _expect(path)
    assert r["reason"] and any("\u4e00" <= ch <= "\u9fff" for ch in r["reason"])     # Chinese reason
    if "pass" in expected:
        assert r["passed"] and r["category"] == "ok" and r["score"] == r["max_score"], r["reason"]
        if max([r["ratio"], *(r.get("hidden_ratios") or [])]) > MARGIN * r["target_ratio"] and path.parent.name in THIN_MARGIN:
            pytest.xfail(THIN_MARGIN[path.parent.name])
        for where, ratio in [("visible", r["ratio"])] + [(f"hidden {i}", x) for i, x in
                                                          enumerate(r.get("hidden_ratios") or [], 1)]:
            assert ratio <= MARGIN * r["target_ratio"], (
                f"passes, but only {ratio:.3f} ({where}) against a target of {r['target_ratio']:.2f} "
                f"(needs <= {MARGIN * r['target_ratio']:.3f})")
    else:
        assert not r["passed"] and r["score"] == 0, r["reason"]
        assert r["category"] in expected, r["reason"]
