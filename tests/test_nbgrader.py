"""nbgrader side of the course: notebooks generated from the specs, the committed release, the
stderr rule, validate (solution passes / starter fails) and a small class graded end to end.

Everything that runs nbgrader works in a temp copy of the course (config + solutions/), never in the
repository. The end-to-end class uses the pilot exercise (the one that grades fastest).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from vramlab import notebooks
from vramlab.grader import notebook_check
from vramlab.exercises import EXERCISES, get_exercise

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "class"
IDS = list(EXERCISES)
# nbgrader's plumbing is the same for every exercise (the check cell differs only in the id): `nbgrader
# validate` runs one exercise that measures nothing (estimate), one that trains in one process and one
# on 2 gloo ranks. That every reference's result satisfies its hidden tests is checked for all 30 on
# recorded results (tests/test_judges_recorded.py); every exercise's own pass/fail is graded in
# tests/test_exercises*.py.
VALIDATE_IDS = ["ch01-estimate", "ch05-accumulation", "ch08-allreduce"]
# the released starter fails every graded cell: one exercise that measures nothing, one that trains
INVERT_IDS = ["ch01-estimate", "ch05-accumulation"]
PILOT = os.environ.get("VRAMLAB_PILOT_EXERCISE", "ch05-accumulation")


def nbgrader(cwd, *args, timeout=900):
    return subprocess.run(notebooks.nbgrader_cmd() + list(args), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=notebooks.venv_env())


def cell(nb, suffix):
    (c,) = [c for c in nb.cells if c.get("id", "").endswith("-" + suffix)]
    return c


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A temp course with every notebook generated from the specs and every assignment released
    (gradebook filled); test_committed_notebooks_match_the_specs compares it with the repo."""
    root = tmp_path_factory.mktemp("course")
    shutil.copy2(ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    notebooks.write_sources(root, IDS)
    notebooks.release(root, IDS)
    return root


# ---------------------------------------------------------------------------------------------------
# Generation from the specs
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eid", IDS)
def test_generation_is_deterministic(eid):
    spec = get_exercise(eid)
    assert notebooks.dumps(notebooks.build_source_notebook(spec)) == \
        notebooks.dumps(notebooks.build_source_notebook(spec))


@pytest.mark.slow
def test_committed_notebooks_match_the_specs(course):
    """CI: solutions/ and exercises/ regenerated from the specs (the course fixture, what
    `python -m vramlab.notebooks --check` does) are identical to the committed ones."""
    bad = [f"solutions/{p}" for p in notebooks.diff_trees(course / "solutions", ROOT / "solutions")]
    bad += [f"exercises/{p}" for p in notebooks.diff_trees(course / "exercises", ROOT / "exercises")]
    assert not bad, f"与规格不一致，请运行 scripts/generate_exercises.sh：{bad}"


@pytest.mark.parametrize("eid", IDS)
def test_source_notebook_structure(eid):
    spec = get_exercise(eid)
    nb = nbformat.read(ROOT / "solutions" / eid / f"{eid}.ipynb", as_version=4)
    nbformat.validate(nb)
    intro, answer, check = cell(nb, "intro"), cell(nb, "answer"), cell(nb, "check")
    assert spec.title in intro.source and "怎么评分" in intro.source
    assert answer.metadata.nbgrader["solution"] is True and not answer.metadata.nbgrader["grade"]
    assert spec.starter.strip() in answer.source and spec.solution.strip() in answer.source
    assert answer.source.index(spec.starter.strip()) < answer.source.index("### BEGIN SOLUTION") \
        < answer.source.index(spec.solution.strip()) < answer.source.index("### END SOLUTION")
    meta = check.metadata.nbgrader
    assert meta["grade"] is True and meta["locked"] is True and meta["points"] == spec.points
    assert f"vramlab.check({eid!r})" in check.source
    assert "### BEGIN HIDDEN TESTS" in check.source and "### END HIDDEN TESTS" in check.source
    assert cell(nb, "setup").metadata.nbgrader["locked"] is True


@pytest.mark.parametrize("eid", IDS)
def test_release_keeps_runnable_starter(eid):
    """The learner gets the starter (runs, correct, too much memory), not `raise NotImplementedError`."""
    spec = get_exercise(eid)
    nb = nbformat.read(ROOT / "exercises" / eid / f"{eid}.ipynb", as_version=4)
    answer, check = cell(nb, "answer"), cell(nb, "check")
    assert spec.starter.strip() in answer.source
    for gone in ("BEGIN SOLUTION", "END SOLUTION", "NotImplementedError", "参考答案"):
        assert gone not in answer.source
    assert spec.solution.strip() not in answer.source
    assert "HIDDEN TESTS" not in check.source and "独立复评" not in check.source
    assert f"vramlab.check({eid!r})" in check.source
    ns: dict = {}
    exec(compile(answer.source, "<answer>", "exec"), ns)       # defines the function, runs nothing heavy
    assert callable(ns[spec.function])
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None


# ---------------------------------------------------------------------------------------------------
# stderr must not cost points
# ---------------------------------------------------------------------------------------------------
def test_stderr_preprocessor_keeps_full_points():
    from nbgrader.utils import determine_grade

    graded = nbformat.v4.new_code_cell("check()")
    graded.metadata["nbgrader"] = {"grade": True, "grade_id": "x", "locked": True, "points": 10,
                                   "schema_version": 3, "solution": False, "task": False}
    graded.outputs = [nbformat.v4.new_output("stream", name="stderr", text="UserWarning: 无害的警告\n"),
                      nbformat.v4.new_output("stream", name="stdout", text="通过\n")]
    assert determine_grade(graded)[0] == 0                    # nbgrader 0.9 as shipped: stderr = fail
    nb = nbformat.v4.new_notebook(cells=[graded])
    nb, _ = notebooks.StderrToStdout().preprocess(nb, {})
    assert determine_grade(nb.cells[0]) == (10, 10)
    assert "[stderr] UserWarning" in nb.cells[0].outputs[0].text
    failed = nbformat.v4.new_code_cell("check()", metadata=graded.metadata)
    failed.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])]
    nb2, _ = notebooks.StderrToStdout().preprocess(nbformat.v4.new_notebook(cells=[failed]), {})
    assert determine_grade(nb2.cells[0])[0] == 0              # a real failure still fails


@pytest.mark.slow
def test_nbgrader_config_loads_and_points_at_the_course(course):
    r = nbgrader(course, "db", "assignment", "list")   # loads nbgrader_config.py, reads the gradebook
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    db = course / "nbgrader" / "gradebook.db"
    assert db.exists()
    with sqlite3.connect(db) as con:
        names = {row[0] for row in con.execute("select name from assignment")}
    assert names == set(IDS)


# ---------------------------------------------------------------------------------------------------
# validate: the solution passes, the released starter fails every graded cell
# ---------------------------------------------------------------------------------------------------
SOLUTIONS_PASS = "Success! Your notebook passes all the tests."
STARTERS_FAIL = "Success! The notebook does not pass any tests."


@pytest.fixture(scope="module")
def validated(course):
    """One `nbgrader validate` for the solutions and one (--invert) for the released starters: a
    new nbgrader costs seconds, each notebook still runs in its own kernel."""
    solutions = nbgrader(course, "validate", *[f"solutions/{e}/{e}.ipynb" for e in VALIDATE_IDS])
    starters = nbgrader(course, "validate", "--invert", *[f"exercises/{e}/{e}.ipynb" for e in INVERT_IDS])
    return {"solutions": solutions, "starters": starters}


def _validated_each(course, validated, which: str, eid: str, args: list[str], success: str):
    r = validated[which]
    if r.stdout.count(success) == len(VALIDATE_IDS if which == "solutions" else INVERT_IDS):
        return
    alone = nbgrader(course, "validate", *args)           # which one: validate it alone for the message
    assert success in alone.stdout, alone.stdout[-4000:] + alone.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("eid", VALIDATE_IDS)
def test_validate_solution_passes(course, validated, eid):
    _validated_each(course, validated, "solutions", eid, [f"solutions/{eid}/{eid}.ipynb"], SOLUTIONS_PASS)


@pytest.mark.slow
@pytest.mark.parametrize("eid", INVERT_IDS)
def test_validate_released_starter_fails_every_graded_cell(course, validated, eid):
    _validated_each(course, validated, "starters", eid, ["--invert", f"exercises/{eid}/{eid}.ipynb"], STARTERS_FAIL)


# ---------------------------------------------------------------------------------------------------
# A small class, end to end
# ---------------------------------------------------------------------------------------------------
def _submission(course: Path, eid: str, answer_source: str | None) -> nbformat.NotebookNode:
    nb = nbformat.read(course / "exercises" / eid / f"{eid}.ipynb", as_version=4)
    if answer_source is not None:
        cell(nb, "answer").source = answer_source
    return nb


# A submission whose top-level code (run by autograde's kernel, not by the grader) goes for the course:
# writes through ../../.. and absolute paths, lists what it sees, and plants links that nbgrader itself
# would follow once the kernel has stopped (the executed notebook is written to <id>.ipynb;
# generate_feedback copies the folder's files). The kernel's sandbox must leave all of it harmless.
HOSTILE_TOPLEVEL = """
# 恶意提交：顶层代码在自动评分的 kernel 里读写课程目录。
import json, os
COURSE, EID = {course!r}, {eid!r}
seen = {{"cwd": os.getcwd(), "listing": sorted(os.listdir("../../..")), "course": os.path.exists(COURSE),
        "wrote": []}}
for p in ("../../../gradebook.db", "../../../pwned.txt", "../../../submitted/alice/" + EID + "/" + EID + ".ipynb",
          "../../../../solutions/" + EID + "/" + EID + ".ipynb", COURSE + "/nbgrader/gradebook.db",
          COURSE + "/nbgrader/pwned.txt", COURSE + "/solutions/" + EID + "/" + EID + ".ipynb"):
    try:
        with open(p, "w") as f:
            f.write("pwned")
        seen["wrote"].append(p)
    except OSError:
        pass
os.remove(EID + ".ipynb")
os.symlink("../../../gradebook.db", EID + ".ipynb")
os.symlink("../../../../solutions/" + EID + "/" + EID + ".ipynb", "leak.ipynb.txt")
print(json.dumps(seen))
"""


def _put(course: Path, student: str, eid: str, nb_or_text) -> Path:
    d = course / "nbgrader" / "submitted" / student / eid
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{eid}.ipynb"
    if isinstance(nb_or_text, str):
        path.write_text(nb_or_text, encoding="utf-8")
    else:
        nbformat.write(nb_or_text, path)
    (d / "timestamp.txt").write_text("2026-01-15 12:00:00.000000 UTC")
    return path


def test_trusted_regrade_decides_the_score():
    """The check cell's score is the grader's verdict from outside the kernel, both ways: a kernel
    that "passed" (a faked check) gets 0 when the grader fails it, and a kernel error (the learner
    broke vramlab.check in the kernel) costs nothing when the grader passes the function."""
    pytest.importorskip("nbgrader")
    from nbgrader import utils

    from vramlab.grader import autograde

    eid = PILOT
    nb = notebooks.build_source_notebook(get_exercise(eid))
    check = cell(nb, "check")
    assert autograde.exercise_of(check) == eid and autograde.exercise_of(cell(nb, "answer")) is None
    points = check.metadata.nbgrader["points"]

    check.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✅ 通过（假的）\n")]
    autograde.rewrite_outputs(check, {"passed": False, "reason": "峰值超标"}, "❌ 未通过")
    assert utils.determine_grade(check)[0] == 0
    assert check.outputs[0].text == "✅ 通过（假的）\n" and check.outputs[-1].evalue == "峰值超标"

    check.outputs = [nbformat.v4.new_output("error", ename="AttributeError", evalue="no check", traceback=[])]
    autograde.rewrite_outputs(check, {"passed": True}, "✅ 通过")
    assert utils.determine_grade(check)[0] == points
    assert "[kernel 里的错误，不计分] AttributeError" in check.outputs[0].text


@pytest.mark.slow
def test_class_end_to_end(course):
    from vramlab.grader import autograde

    eid = PILOT
    spec = get_exercise(eid)
    fill = {"function": spec.function, "signature": spec.signature}
    noisy = (FIXTURES / "noisy_stderr.py").read_text(encoding="utf-8")
    hostile = (FIXTURES / "hostile_answer.py").read_text(encoding="utf-8").format(**fill)
    _put(course, "alice", eid, _submission(course, eid, spec.solution.strip() + "\n" + noisy))  # correct + stderr
    _put(course, "bob", eid, _submission(course, eid, None))                                    # the starter
    _put(course, "mallory", eid, _submission(course, eid, hostile))                             # hostile
    _put(course, "eve", eid, (FIXTURES / "malformed.ipynb").read_text(encoding="utf-8"))        # not JSON
    trudy = HOSTILE_TOPLEVEL.format(course=str(course), eid=eid) + "\n\n" + spec.starter.strip() + "\n"
    _put(course, "trudy", eid, _submission(course, eid, trudy))                                 # goes for the course
    protected = [course / "solutions" / eid / f"{eid}.ipynb",
                 course / "nbgrader" / "submitted" / "alice" / eid / f"{eid}.ipynb"]
    before = [p.read_bytes() for p in protected]

    t0 = time.perf_counter()
    r = nbgrader(course, "autograde", eid)
    log = r.stdout + r.stderr
    print(f"autograde: {time.perf_counter() - t0:.0f} s")
    assert r.returncode != 0                                  # nbgrader reports the broken one ...
    assert "There was an error processing assignment" in log and "eve" in log
    # no locked cell was edited: restoring the hidden tests raises no false checksum alarm (nbgrader#1961)
    assert "Attribute 'checksum'" not in log and "隐藏测试" in log, log[-6000:]
    for s in ("alice", "bob", "mallory", "trudy"):            # ... and still grades the others
        assert (course / "nbgrader" / "autograded" / s / eid / f"{eid}.ipynb").exists(), log[-6000:]

    from nbgrader.api import Gradebook

    db_url = "sqlite:///" + str(course / "nbgrader" / "gradebook.db")
    with Gradebook(db_url, "vramlab") as gb:                  # the gradebook survived the batch
        scores = {s: gb.find_submission(eid, s).score for s in ("alice", "bob", "mallory", "trudy")}
    assert scores == {"alice": spec.points, "bob": 0, "mallory": 0, "trudy": 0}, (scores, log[-6000:])

    # trudy's top-level code ran in the sandbox: the course was absent, nothing was written outside
    # her folder, and the links she left were removed before nbgrader wrote her notebook
    assert [p.read_bytes() for p in protected] == before
    assert not (course / "nbgrader" / "pwned.txt").exists()
    tdir = course / "nbgrader" / "autograded" / "trudy" / eid
    assert not [p for p in tdir.rglob("*") if p.is_symlink()], sorted(os.listdir(tdir))
    tnb = nbformat.read(tdir / f"{eid}.ipynb", as_version=4)
    text = "".join(o.get("text", "") for o in cell(tnb, "answer").outputs if o.output_type == "stream")
    seen = json.loads(text.strip().splitlines()[-1])
    assert seen["cwd"] == "/submission" and seen["course"] is False and seen["wrote"] == [], seen
    assert not {"submitted", "autograded", "gradebook.db", "solutions"} & set(seen["listing"]), seen

    # the stderr written during the graded cell is kept, as stdout, and cost nothing
    graded = nbformat.read(course / "nbgrader" / "autograded" / "alice" / eid / f"{eid}.ipynb", as_version=4)
    outs = cell(graded, "check").outputs
    assert not [o for o in outs if o.output_type == "stream" and o.name == "stderr"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "写到 stderr 的警告（Python 层）" in text           # layer 1: redirect_stderr around check()
    assert "[stderr] UserWarning" in text                     # layer 2: fd 2 / after the block, relabelled
    assert notebook_check.DEFERRED_MESSAGE in text            # the kernel measured nothing ...
    assert autograde.REPORT_HEADER.strip() in text and "通过" in text   # ... the grader outside it did
    # mallory's kernel ran her fake check ("通过（假的）"); the score is the grader's, outside the kernel
    mal = nbformat.read(course / "nbgrader" / "autograded" / "mallory" / eid / f"{eid}.ipynb", as_version=4)
    mal_outs = cell(mal, "check").outputs
    mal_text = "".join(o.get("text", "") for o in mal_outs if o.output_type == "stream")
    assert "通过（假的）" in mal_text and autograde.REPORT_HEADER.strip() in mal_text, mal_text
    assert any(o.output_type == "error" for o in mal_outs)

    r = nbgrader(course, "generate_feedback", eid)
    assert not (course / "nbgrader" / "feedback" / "trudy" / eid / "leak.ipynb.txt").exists()
    for s in ("alice", "bob", "mallory"):
        html = (course / "nbgrader" / "feedback" / s / eid / f"{eid}.html").read_text(encoding="utf-8")
        assert "峰值" in html or "通过" in html, s            # Chinese messages printed by check()
    assert "练习编号" in html

    out = course / "nbgrader" / "grades.csv"
    r = nbgrader(course, "export", "--to", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    exported = list(csv.DictReader(out.open(encoding="utf-8")))
    assert {row["assignment"] for row in exported} == {eid}   # only what was handed in, not all 33
    rows = {row["student_id"]: row for row in exported}
    assert float(rows["alice"]["score"]) == spec.points
    assert all(float(rows[s]["score"]) == 0 for s in ("bob", "mallory", "trudy"))
    assert float(rows["alice"]["max_score"]) == spec.points
    assert float(rows.get("eve", {"score": 0})["score"]) == 0


@pytest.mark.slow
def test_autograde_refuses_without_sandbox(course):
    """No bubblewrap (not on PATH here): autograde's kernel refuses to start, nbgrader records the error
    for the submission and exits non-zero; nothing of the submission was executed."""
    from vramlab.grader import policy

    if policy.bwrap_path() is None and not os.environ.get("VRAMLAB_REQUIRE_SANDBOX"):
        pytest.skip("bubblewrap 不可用：这台机器上本来就没有沙箱")
    eid = next(i for i in IDS if i != PILOT)              # not the end-to-end test's assignment
    marker = course / "nbgrader" / "ran-without-sandbox"
    _put(course, "nobwrap", eid, _submission(course, eid, f"open({str(marker)!r}, 'w').close()\n"))
    env = notebooks.venv_env({"PATH": str(Path(sys.executable).parent)})
    r = subprocess.run(notebooks.nbgrader_cmd() + ["autograde", eid, "--student", "nobwrap"], cwd=course,
                       capture_output=True, text=True, timeout=300, env=env)
    log = r.stdout + r.stderr
    assert r.returncode != 0 and "There was an error processing assignment" in log, log[-4000:]
    assert "拒绝启动自动评分 kernel" in log, log[-4000:]
    assert not marker.exists()


@pytest.mark.slow
def test_batch_grading_with_progress(tmp_path):
    """The parallel path (vramlab.grader.batch) grades a nbgrader layout and records a broken file as one row."""
    from vramlab.grader.batch import grade_many

    eid = PILOT
    spec = get_exercise(eid)
    good = tmp_path / "alice" / eid / f"{eid}.ipynb"
    bad = tmp_path / "eve" / eid / f"{eid}.ipynb"
    good.parent.mkdir(parents=True)
    bad.parent.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / eid / f"{eid}.ipynb", good)
    shutil.copy(FIXTURES / "malformed.ipynb", bad)
    rows = grade_many([good, bad], workers=2, backend="sim", progress=True)
    assert [r["student"] for r in rows] == ["alice", "eve"]
    assert rows[0]["passed"] is True and rows[0]["score"] == spec.points
    assert rows[1]["passed"] is False and rows[1]["score"] == 0 and rows[1]["reason"]


@pytest.mark.slow
def test_release_holds_no_reference_solution(course):
    """solutions/<id>/solution.py is in every source folder; nbgrader's generate_assignment copies a
    source folder's other files into the release unless nbgrader_config.py ignores them."""
    assert all((course / "solutions" / i / "solution.py").is_file() for i in IDS)
    released = sorted(str(p.relative_to(course)) for p in (course / "exercises").rglob("*") if p.is_file())
    assert released and all(p.endswith(".ipynb") for p in released), released
