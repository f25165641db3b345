"""vramlab.grader.gradebook: the batch's scores in nbgrader's gradebook (`--gradebook` of the local
batch and of `--slurm`). Every test builds a real nbgrader gradebook with nbgrader's own API, laid
out as `nbgrader generate_assignment` lays out this course (one assignment and one notebook per
exercise id, its cells' nbgrader metadata read from the released exercises/<id>/<id>.ipynb), and
reads the result back through the same API.

Checked: scores land in the graded cell's auto_score (from nothing: a writer that does nothing
fails), a manual score is never overwritten, unknown students / assignments and grader errors are
skipped with a Chinese reason, a rerun changes nothing, a crash mid-way loses nothing that a rerun
does not fill in, the CSV's rows work as well as the batch's, the command line checks the
gradebook before grading and writes it after the CSV (a locked gradebook costs no CSV), and the
Slurm mode's finish() writes the gradebook named at submit time. One slow test grades for real."""
from __future__ import annotations

import csv
import json
import shlex
import sqlite3
from pathlib import Path

import pytest
from nbgrader.api import Course, Gradebook, MissingEntry

from vramlab.exercises import EXERCISES, get_exercise
from vramlab.grader import batch, gradebook, slurm

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide" / "grading.md"
EX = "ch01-estimate"
OTHER = "ch05-accumulation"           # in the course, not in the test's gradebook
# what the slow test runs and prints, as docs/guide/grading.md shows it (verbatim)
COMMAND = "python -m vramlab.grader.batch --workers 1 --csv nbgrader/vramlab_grades.csv --gradebook"
FIRST = ["已写入 nbgrader/vramlab_grades.csv（3 行）", "成绩库 nbgrader/gradebook.db：写入 2 份分数；跳过 1 份",
         "  成绩库里没有这个学号（用 nbgrader db student add <学号> 添加后重跑）：carol/ch01-estimate"]
AGAIN = ["成绩库 nbgrader/gradebook.db：写入 0 份分数，2 份与成绩库里的相同（未改动）；1 份有人工评分，人工分保留不动、"
         "成绩以它为准；跳过 1 份"]


@pytest.fixture(autouse=True)
def _alembic_in_process(monkeypatch):
    """A new gradebook gets its alembic stamp from nbgrader's migrations, read here: nbgrader runs
    `alembic heads` as a process for it, which the fast tier may not start (conftest.py)."""
    import nbgrader
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()
    monkeypatch.setattr("nbgrader.api.get_alembic_version", lambda: head)


def _released_cells(eid: str) -> list[dict]:
    nb = json.loads((ROOT / "exercises" / eid / f"{eid}.ipynb").read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader")]


def _make_gradebook(path: Path, exercises=(EX,), students=("alice", "bob")) -> str:
    """What `nbgrader generate_assignment` and `nbgrader db student add` leave, through nbgrader's API."""
    url = f"sqlite:///{path}"
    with Gradebook(url, course_id="vramlab") as gb:
        for eid in exercises:
            gb.add_assignment(eid)
            gb.add_notebook(eid, eid)
            for cell in _released_cells(eid):
                meta = cell["metadata"]["nbgrader"]
                if meta.get("grade"):
                    gb.add_grade_cell(meta["grade_id"], eid, eid, max_score=meta["points"], cell_type=cell["cell_type"])
                if meta.get("solution"):
                    gb.add_solution_cell(meta["grade_id"], eid, eid)
        for student in students:
            gb.add_student(student)
    return url


@pytest.fixture
def book(tmp_path) -> str:
    return _make_gradebook(tmp_path / "gradebook.db")


def _row(student: str, score, exercise: str = EX, category: str = "ok", max_score=10, path: str | None = None) -> dict:
    """A row as batch.grade_many returns it (FIELDS)."""
    return {"student": student, "exercise": exercise, "path": path or f"sub/{student}/{exercise}/{exercise}.ipynb",
            "passed": category == "ok", "score": score, "max_score": max_score, "category": category, "reason": ""}


def _grade(url: str, student: str, eid: str = EX):
    """(auto_score, manual_score, needs_manual_grade, score) of the check cell, or None: no submission."""
    with Gradebook(url, course_id="vramlab") as gb:
        try:
            g = gb.find_grade(f"{eid}-check", eid, eid, student)
        except MissingEntry:
            return None
        return g.auto_score, g.manual_score, g.needs_manual_grade, g.score


def _snapshot(url: str) -> list:
    """Everything a rerun could change: every submission's grades, the students and the courses."""
    grades = []
    with Gradebook(url, course_id="vramlab") as gb:
        for a in gb.assignments:
            for sub in gb.assignment_submissions(a.name):
                for nb in sub.notebooks:
                    grades += [(sub.student_id, a.name, nb.name, g.name, g.auto_score, g.manual_score,
                                g.needs_manual_grade, g.extra_credit, str(sub.timestamp)) for g in nb.grades]
        return [sorted(map(str, grades)), sorted(s.id for s in gb.students), sorted(c.id for c in gb.db.query(Course))]


# -- the layout the writer relies on ----------------------------------------------------------------

@pytest.mark.parametrize("eid", list(EXERCISES))
def test_each_released_notebook_has_one_graded_cell_named_id_check(eid):
    """The writer scores `<id>-check` of notebook `<id>` in assignment `<id>`: that is the released
    notebook's only graded cell, worth the spec's points (what the batch's max_score is)."""
    graded = [c["metadata"]["nbgrader"] for c in _released_cells(eid) if c["metadata"]["nbgrader"].get("grade")]
    assert [(m["grade_id"], m["points"]) for m in graded] == [(f"{eid}-check", get_exercise(eid).points)]


# -- writing -----------------------------------------------------------------------------------------

def test_scores_are_written_into_the_graded_cell(book):
    assert _grade(book, "alice") is None and _grade(book, "bob") is None        # nothing there before
    summary = gradebook.write([_row("alice", 10), _row("bob", 0, category="technique")], book)
    assert (summary.written, summary.unchanged, summary.skipped, summary.error) == (2, 0, [], None)
    assert _grade(book, "alice") == (10.0, None, False, 10.0)
    assert _grade(book, "bob") == (0.0, None, False, 0.0)
    with Gradebook(book, course_id="vramlab") as gb:                          # the submission nbgrader would add
        sub = gb.find_submission(EX, "alice")
        assert [nb.name for nb in sub.notebooks] == [EX] and len(sub.notebooks[0].comments) == 1
        assert gb.find_submission(EX, "alice").score == 10.0
    text = summary.zh()
    assert text.endswith("：写入 2 份分数；跳过 0 份"), text


def test_an_earlier_automatic_score_is_replaced(book):
    gradebook.write([_row("alice", 0, category="technique")], book)
    assert _grade(book, "alice")[0] == 0.0
    summary = gradebook.write([_row("alice", 10)], book)                     # e.g. regraded on a GPU
    assert summary.written == 1 and _grade(book, "alice") == (10.0, None, False, 10.0)


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")   # nbgrader's add_submission, called here as the formgrader would
def test_a_manual_score_is_never_overwritten(book):
    """The formgrader's manual score stays and keeps counting; the changed automatic score is
    flagged for review, as nbgrader's SaveAutoGrades does. Rerunning does not flag it again."""
    with Gradebook(book, course_id="vramlab") as gb:
        gb.add_submission(EX, "alice")
        g = gb.find_grade(f"{EX}-check", EX, EX, "alice")
        g.manual_score, g.needs_manual_grade = 7.0, False                     # what the formgrader saves
        gb.db.commit()
    summary = gradebook.write([_row("alice", 10), _row("bob", 10)], book)
    assert _grade(book, "alice") == (10.0, 7.0, True, 7.0)
    assert summary.manual == [f"alice/{EX}"] and "1 份有人工评分，人工分保留不动" in summary.zh()
    with Gradebook(book, course_id="vramlab") as gb:                          # the instructor reviews it
        g = gb.find_grade(f"{EX}-check", EX, EX, "alice")
        g.needs_manual_grade = False
        gb.db.commit()
    again = gradebook.write([_row("alice", 10), _row("bob", 10)], book)
    assert (again.written, again.unchanged) == (0, 2)
    assert _grade(book, "alice") == (10.0, 7.0, False, 7.0)


def test_unknown_students_assignments_and_rows_without_a_score_are_skipped_with_a_reason(book):
    rows = [_row("alice", 10), _row("carol", 10), _row("alice", 10, exercise=OTHER),
            _row("bob", 0, category="grader_error"), _row("dave", 0, exercise="")]
    summary = gradebook.write(rows, book)
    assert summary.written == 1 and summary.error is None
    assert dict(summary.skipped) == {"carol/ch01-estimate": gradebook.NO_STUDENT, f"alice/{OTHER}": gradebook.NO_ASSIGNMENT,
                                     f"bob/{EX}": gradebook.NO_SCORE, "dave/": gradebook.NO_EXERCISE}
    text = summary.zh()
    assert "跳过 4 份" in text and "成绩库里没有这个学号" in text and "carol/ch01-estimate" in text
    assert "nbgrader db student add" in text and "nbgrader generate_assignment" in text
    assert _grade(book, "bob") is None                        # a grader error is no 0 for the learner
    with Gradebook(book, course_id="vramlab") as gb:
        with pytest.raises(MissingEntry):
            gb.find_student("carol")                          # skipped, not invented
        with pytest.raises(MissingEntry):
            gb.find_assignment(OTHER)


def test_rerunning_changes_nothing(book):
    rows = [_row("alice", 10), _row("bob", 0, category="technique"), _row("carol", 10)]
    first = gradebook.write(rows, book)
    before = _snapshot(book)
    again = gradebook.write(rows, book)
    assert _snapshot(book) == before
    assert (first.written, again.written, again.unchanged, len(again.skipped)) == (2, 0, 2, 1)
    assert "写入 0 份分数，2 份与成绩库里的相同（未改动）" in again.zh()
    assert before[-1] == ["vramlab"]                          # no course row of its own (Gradebook's course_id="")


def test_a_crash_mid_way_keeps_what_was_written_and_a_rerun_fills_in(book, monkeypatch):
    from sqlalchemy.exc import OperationalError

    real = gradebook._write_one
    calls = []

    def dies_on_the_second(gb, row, score, summary):
        calls.append(row["student"])
        if len(calls) == 2:
            raise OperationalError("UPDATE grade", {}, sqlite3.OperationalError("database is locked"))
        return real(gb, row, score, summary)
    monkeypatch.setattr(gradebook, "_write_one", dies_on_the_second)
    rows = [_row("alice", 10), _row("bob", 0, category="technique")]
    summary = gradebook.write(rows, book)
    assert summary.written == 1 and summary.unwritten == 1 and "锁住" in summary.error
    assert "还有 1 份没有写" in summary.zh() and "重跑" in summary.zh()
    assert _grade(book, "alice")[0] == 10.0 and _grade(book, "bob") is None   # committed one by one
    monkeypatch.setattr(gradebook, "_write_one", real)
    again = gradebook.write(rows, book)
    assert (again.written, again.unchanged, again.error) == (1, 1, None)
    assert _grade(book, "bob")[0] == 0.0


def test_the_csvs_rows_work_as_well(book, tmp_path):
    """The CSV (strings in every field) is a source as good as the batch's rows."""
    dest = tmp_path / "grades.csv"
    batch.write_csv([_row("alice", 10), _row("bob", 0, category="technique")], dest)
    with open(dest, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["score"] == "10"
    summary = gradebook.write(rows, book)
    assert summary.written == 2 and _grade(book, "alice")[0] == 10.0 and _grade(book, "bob")[0] == 0.0


def test_a_cell_worth_other_points_or_two_files_of_one_student_are_skipped(book):
    summary = gradebook.write([_row("alice", 20, max_score=20)], book)
    assert summary.written == 0 and "满分 10，评分器的满分 20" in summary.skipped[0][1]
    rows = [_row("bob", 10, path="sub/bob/ch01-estimate/a.ipynb"), _row("bob", 0, path="sub/bob/ch01-estimate/b.ipynb")]
    summary = gradebook.write(rows, book)
    assert [r for _, r in summary.skipped] == [gradebook.TWO_FILES] * 2 and _grade(book, "bob") is None
    rows.append(_row("bob", 10))                              # the one named <id>.ipynb is nbgrader's notebook
    summary = gradebook.write(rows, book)
    assert summary.written == 1 and _grade(book, "bob")[0] == 10.0
    assert [r for _, r in summary.skipped] == [gradebook.OTHER_FILE] * 2


def test_a_new_submission_takes_nbgraders_timestamp(book, tmp_path):
    folder = tmp_path / "sub" / "alice" / EX
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text("2026-12-01 08:30:00.000000 UTC\n", encoding="utf-8")
    gradebook.write([_row("alice", 10, path=str(folder / f"{EX}.ipynb"))], book)
    with Gradebook(book, course_id="vramlab") as gb:
        assert str(gb.find_submission(EX, "alice").timestamp) == "2026-12-01 08:30:00"


# -- which gradebook ---------------------------------------------------------------------------------

def test_locate_finds_the_default_and_refuses_what_is_not_a_gradebook(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gradebook.GradebookError, match="默认位置 nbgrader/gradebook.db 和 gradebook.db 都没有成绩库"):
        gradebook.locate(True)
    _make_gradebook(tmp_path / "gradebook.db")                       # nbgrader's own default place
    assert gradebook.locate(True) == f"sqlite:///{tmp_path / 'gradebook.db'}"
    (tmp_path / "nbgrader").mkdir()
    _make_gradebook(tmp_path / "nbgrader" / "gradebook.db")          # this course's nbgrader_config.py: first
    assert gradebook.locate(True) == f"sqlite:///{tmp_path / 'nbgrader' / 'gradebook.db'}"
    with pytest.raises(gradebook.GradebookError, match="找不到成绩库 missing.db"):
        gradebook.locate("missing.db")
    with pytest.raises(gradebook.GradebookError, match="找不到成绩库 missing.db"):
        gradebook.locate("sqlite:///missing.db")
    assert not (tmp_path / "missing.db").exists()                      # looked for, not created
    assert gradebook.locate("sqlite:///gradebook.db") == f"sqlite:///{tmp_path / 'gradebook.db'}"
    with pytest.raises(gradebook.GradebookError, match="后面是提交的文件"):
        gradebook.locate("sub/alice/ch01-estimate/ch01-estimate.ipynb")
    (tmp_path / "grades.csv").write_text("student\n", encoding="utf-8")
    with pytest.raises(gradebook.GradebookError, match="不是 SQLite 数据库"):
        gradebook.locate("grades.csv")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("create table t (x)")
    data = other.read_bytes()
    with pytest.raises(gradebook.GradebookError, match="不是 nbgrader 的成绩库"):
        gradebook.locate(str(other))
    assert other.read_bytes() == data                                # nbgrader's tables were not added to it


# -- the command lines -------------------------------------------------------------------------------

def _subs(tmp_path: Path, students=("alice", "bob", "carol")) -> list[str]:
    paths = []
    for s in students:
        p = tmp_path / "sub" / s / EX / f"{EX}.ipynb"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"submission of {s}\n", encoding="utf-8")
        paths.append(str(p))
    return paths


@pytest.fixture
def fake_grading(monkeypatch):
    """batch.grade_many replaced: alice passes, everyone else gets 0."""
    calls = []

    def grade_many(paths, **kw):
        calls.append(paths)
        kw["started"]()
        return [_row(Path(p).parent.parent.name, 10 if "/alice/" in p else 0,
                     category="ok" if "/alice/" in p else "technique", path=p) for p in paths]
    monkeypatch.setattr(batch, "grade_many", grade_many)
    return calls


def test_the_batch_writes_the_gradebook_after_the_csv(tmp_path, book, fake_grading, capsys):
    dest = tmp_path / "grades.csv"
    argv = ["--no-sandbox", "--csv", str(dest), *_subs(tmp_path), "--gradebook", str(tmp_path / "gradebook.db")]
    assert batch.main(argv) == 0
    err = capsys.readouterr().err
    assert dest.is_file() and err.index("已写入") < err.index("成绩库")
    assert "写入 2 份分数" in err and "跳过 1 份" in err and "成绩库里没有这个学号" in err and "carol" in err
    assert _grade(book, "alice")[0] == 10.0 and _grade(book, "bob")[0] == 0.0
    before = _snapshot(book)
    assert batch.main(argv) == 0 and _snapshot(book) == before                  # the same command again
    assert "写入 0 份分数，2 份与成绩库里的相同" in capsys.readouterr().err


def test_the_flag_alone_uses_the_courses_gradebook(tmp_path, fake_grading, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nbgrader").mkdir()
    url = _make_gradebook(tmp_path / "nbgrader" / "gradebook.db")
    subs = [str(Path(p).relative_to(tmp_path)) for p in _subs(tmp_path, ("alice",))]
    assert batch.main(["--no-sandbox", "--csv", "grades.csv", *subs, "--gradebook"]) == 0
    assert "成绩库 nbgrader/gradebook.db：写入 1 份分数" in capsys.readouterr().err
    assert _grade(url, "alice")[0] == 10.0


@pytest.mark.parametrize("where, needle", [("missing.db", "找不到成绩库"), ("first-sub", "后面是提交的文件")])
def test_a_bad_gradebook_is_refused_before_grading(tmp_path, fake_grading, capsys, where, needle):
    subs = _subs(tmp_path)
    dest = tmp_path / "grades.csv"
    target = str(tmp_path / where) if where != "first-sub" else subs[0]      # `--gradebook sub1 sub2`
    assert batch.main(["--no-sandbox", "--csv", str(dest), "--gradebook", target, *subs[1:]]) == 2
    err = capsys.readouterr().err
    assert needle in err and "还没有开始评分" in err
    assert fake_grading == [] and not dest.exists()


@pytest.mark.slow                                             # SQLite waits 5 s for a lock, twice
def test_a_locked_gradebook_costs_no_csv_and_a_rerun_writes_it(tmp_path, book, fake_grading, capsys, monkeypatch):
    """Locked at the start: refused before grading. Locked while the class is graded (another
    program writing it): the CSV is written, the summary says what is missing, exit 4; the same
    command again writes it."""
    db = tmp_path / "gradebook.db"
    dest = tmp_path / "grades.csv"
    argv = ["--no-sandbox", "--csv", str(dest), *_subs(tmp_path), "--gradebook", str(db)]
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("begin exclusive")
    try:
        assert batch.main(argv) == 2
        assert "成绩库被另一个程序锁住了" in capsys.readouterr().err and fake_grading == [] and not dest.exists()
        holder.execute("rollback")
        grade_many = batch.grade_many

        def locked_while_grading(paths, **kw):
            holder.execute("begin exclusive")
            return grade_many(paths, **kw)
        monkeypatch.setattr(batch, "grade_many", locked_while_grading)
        assert batch.main(argv) == 4
    finally:
        if holder.in_transaction:
            holder.execute("rollback")
        holder.close()
    err = capsys.readouterr().err
    assert "没有写完：成绩库被另一个程序锁住了" in err and "还有 3 份没有写" in err and "重跑" in err
    with open(dest, newline="", encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == 3
    assert _grade(book, "alice") is None
    monkeypatch.setattr(batch, "grade_many", grade_many)     # nobody holds it now
    assert batch.main(argv) == 0 and _grade(book, "alice")[0] == 10.0


def test_the_slurm_mode_writes_the_gradebook_named_at_submit_time(tmp_path, book, capsys):
    """finish() (after the array, or on --attach) writes the gradebook the run recorded, after the CSV."""
    state, run_id = tmp_path / "grades.csv.slurm", "20261206-100000-t-aaaaaa"
    items = [{"student": s, "exercise": EX, "path": f"sub/{s}/{EX}/{EX}.ipynb", "key": f"k-{s}"} for s in ("alice", "bob")]
    lines = [{"key": it["key"], **_row(it["student"], 10 if it["student"] == "alice" else 0, path=it["path"])} for it in items]
    folder = state / "runs" / run_id / "journal"
    folder.mkdir(parents=True)
    (folder / "task-0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    run = {"run": run_id, "items": items, "todo": [0, 1], "tasks": 1, "job_id": None, "backend": "sim", "scale": "ci",
           "csv": str(tmp_path / "grades.csv"), "gradebook": book}
    args = slurm.build_parser().parse_args(["--attach", run_id, "--csv", str(tmp_path / "grades.csv")])
    assert args.gradebook is None
    assert slurm.finish(run, slurm.Journals(state, ended={run_id}), args, state) == 0
    err = capsys.readouterr().err
    assert (tmp_path / "grades.csv").is_file() and err.index("已写入") < err.index("成绩库")
    assert _grade(book, "alice")[0] == 10.0 and _grade(book, "bob")[0] == 0.0


def test_the_slurm_mode_refuses_a_bad_gradebook_before_submitting(tmp_path, capsys, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm, "submit", lambda *a: pytest.fail("submitted"))
    code = slurm.main(["--slurm", "--csv", str(tmp_path / "g.csv"), "--gradebook", str(tmp_path / "no.db"), "x.ipynb"])
    assert code == 2 and "找不到成绩库" in capsys.readouterr().err


# -- for real ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_real_batch_fills_the_gradebook(tmp_path, capsys, monkeypatch):
    """The command the guide shows, on a small class of ch01-estimate: the reference solution
    (10 points), the released starter (0) and a student the gradebook does not know. Then the
    instructor overrides bob's score in the formgrader, and the same command runs again."""
    from vramlab.grader import cgroup

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VRAMLAB_WARM_PARK_S", "0")
    (tmp_path / "nbgrader").mkdir()
    url = _make_gradebook(tmp_path / "nbgrader" / "gradebook.db")
    for student, kind in (("alice", "solutions"), ("bob", "exercises"), ("carol", "solutions")):
        p = tmp_path / "nbgrader" / "submitted" / student / EX / f"{EX}.ipynb"
        p.parent.mkdir(parents=True)
        p.write_bytes((ROOT / kind / EX / f"{EX}.ipynb").read_bytes())
    argv = shlex.split(COMMAND)[3:] + ([] if cgroup.available() else ["--no-cgroup"])
    assert batch.main(argv) == 0
    err = capsys.readouterr().err
    assert all(line in err.splitlines() for line in FIRST), err
    assert _grade(url, "alice") == (10.0, None, False, 10.0) and _grade(url, "bob") == (0.0, None, False, 0.0)
    with Gradebook(url, course_id="vramlab") as gb:                           # the formgrader: 5 points for bob
        g = gb.find_grade(f"{EX}-check", EX, EX, "bob")
        g.manual_score, g.needs_manual_grade = 5.0, False
        gb.db.commit()
    before = _snapshot(url)
    assert batch.main(argv) == 0                              # from the journal: nothing graded again
    err = capsys.readouterr().err
    assert "复用已有成绩 3 份" in err and all(line in err.splitlines() for line in AGAIN), err
    assert _snapshot(url) == before and _grade(url, "bob") == (0.0, 5.0, False, 5.0)


def test_the_guide_shows_what_the_real_batch_runs_and_prints():
    text = GUIDE.read_text(encoding="utf-8").splitlines()
    for line in [COMMAND, *FIRST, *AGAIN]:
        assert line in text, line
