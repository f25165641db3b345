"""Write the batch's scores into nbgrader's gradebook (`--gradebook` of the batch and of `--slurm`).

    from vramlab.grader import gradebook
    url = gradebook.locate(True)                 # nbgrader/gradebook.db, else ./gradebook.db
    summary = gradebook.write(rows, url)         # rows: batch.grade_many's (or the CSV's)
    print(summary.zh())

Where a score goes: the course's layout (nbgrader_config.py, notebooks.py) is one assignment per
exercise id, one notebook in it named after the id, and one graded cell, `<id>-check`
(autograde.CHECK_SUFFIX), worth the spec's points. Only that cell is written; any other grade cell
of the notebook is left alone.

auto_score, never manual_score. nbgrader keeps the two apart (nbgrader/api.py, class Grade):
`SaveAutoGrades` (preprocessors/saveautogrades.py) writes only auto_score, the formgrader writes
manual_score, and `Grade.score` counts manual_score whenever it is set, auto_score otherwise. So
the batch writes what `nbgrader autograde` would write, and a score an instructor typed in stays
the one that counts. As in SaveAutoGrades, an auto_score that changes under a manual score sets
needs_manual_grade, so the formgrader lists it for review; an unchanged one touches nothing, so a
rerun leaves the gradebook as it was. Without a manual score needs_manual_grade is cleared, as
SaveAutoGrades does for a scored code cell.

Only through nbgrader's `Gradebook` API. A submission missing from the gradebook is added
(`add_submission`, with nbgrader's timestamp.txt when the submitted folder has one) when both the
assignment and the student are there; an unknown assignment or student, a row without a score (a
grader error) or a gradebook cell worth other points than the grader's is skipped, with its reason
in the summary. Each submission is one commit: a crash keeps what was committed, and the same
command again (the rows come back from the journal, nothing is regraded) writes the rest. A
database error stops the writing and is reported; the CSV is already written by then.
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# this course's nbgrader_config.py puts it in nbgrader/; nbgrader's own default is <root>/gradebook.db
DEFAULT_PATHS = (Path("nbgrader") / "gradebook.db", Path("gradebook.db"))
SQLITE_MAGIC = b"SQLite format 3\x00"

NO_EXERCISE = "无法判断练习编号（用 --exercise 指定）"
NO_SCORE = "评分器出错，没有分数（修好后用相同的命令重跑，会补写）"
NO_ASSIGNMENT = "成绩库里没有这个作业（先运行 nbgrader generate_assignment <编号>）"
NO_STUDENT = "成绩库里没有这个学号（用 nbgrader db student add <学号> 添加后重跑）"
NO_CELL = "成绩库的这个作业里没有评分单元格 <编号>-check（重新运行 nbgrader generate_assignment <编号>）"
TWO_FILES = "同一学号、同一练习有几份提交，不知道该记哪一份（只保留 <编号>.ipynb 那份后重跑）"
OTHER_FILE = "同一学号、同一练习的另一份文件：成绩库记的是 <编号>.ipynb 那份"


class GradebookError(Exception):
    """The gradebook cannot be used (Chinese message); said before any grading starts."""


def locate(value) -> str:
    """The database URL for `--gradebook [PATH]`: True (the flag alone) is the first of
    DEFAULT_PATHS that exists; another database's URL (`postgresql://...`) is used as given; a path
    or `sqlite:///` URL must be an existing SQLite file with nbgrader's tables: nbgrader's Gradebook
    would create an empty gradebook anywhere, and add its tables to any database."""
    if value is True:
        found = [p for p in DEFAULT_PATHS if p.is_file()]
        if not found:
            raise GradebookError(f"--gradebook 没有给路径，但默认位置 {' 和 '.join(map(str, DEFAULT_PATHS))} 都没有成绩库："
                                 "在课程目录里运行，或写成 --gradebook=成绩库路径")
        value = found[0]
    value = str(value)
    if "://" in value and not value.startswith("sqlite:///"):
        _check_tables(value, value)
        return value
    path = Path(value.removeprefix("sqlite:///"))       # a SQLite file: checked as a path, never created
    if path.suffix == ".ipynb":          # `--gradebook sub1.ipynb sub2.ipynb`: the flag took a submission
        raise GradebookError(f"--gradebook 后面是提交的文件 {path}，不是成绩库：只写 --gradebook 时请把它放在提交文件之后，"
                             "或写成 --gradebook=成绩库路径")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        raise GradebookError(f"找不到成绩库 {path}（nbgrader 的 gradebook.db；nbgrader generate_assignment 会创建它）") from None
    except OSError as e:
        from ..errors import os_error_zh
        raise GradebookError(f"打不开成绩库 {path}：{os_error_zh(e, path=False)}") from None
    if head != SQLITE_MAGIC:
        raise GradebookError(f"{path} 不是 nbgrader 的成绩库（不是 SQLite 数据库）")
    url = f"sqlite:///{path.resolve()}"
    _check_tables(url, path)
    return url


def _check_tables(url: str, shown) -> None:
    """Refuse a database without nbgrader's tables: Gradebook() would add them to it."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.exc import SQLAlchemyError

    engine = None
    try:
        engine = create_engine(url)
        tables = set(inspect(engine).get_table_names())
    except (SQLAlchemyError, ImportError) as e:       # ImportError: no driver for that URL's database
        raise GradebookError(f"打不开成绩库 {shown}：{db_error_zh(e)}") from None
    finally:
        if engine is not None:
            engine.dispose()
    if not {"assignment", "student", "grade", "grade_cells"} <= tables:
        raise GradebookError(f"{shown} 不是 nbgrader 的成绩库（没有 assignment、student、grade 等表）")


def db_error_zh(e: Exception) -> str:
    """A database error in Chinese, for the summary (SQLAlchemy's text is long and English)."""
    raw = str(getattr(e, "orig", None) or e).strip()
    text = raw.splitlines()[0] if raw else type(e).__name__
    if "locked" in text:
        return "成绩库被另一个程序锁住了（例如 formgrader 或 nbgrader autograde 正在写）"
    if "readonly" in text or "read-only" in text:
        return "成绩库是只读的（没有写权限）"
    return f"数据库错误：{text}"


@dataclass
class Summary:
    where: str
    written: int = 0                     # auto_score set or changed
    unchanged: int = 0                   # already this score: not touched
    manual: list[str] = field(default_factory=list)              # "student/exercise" with a manual score kept
    skipped: list[tuple[str, str]] = field(default_factory=list)  # ("student/exercise", reason)
    error: str | None = None             # the database error that stopped the writing
    unwritten: int = 0                   # rows left when it stopped

    def zh(self) -> str:
        """The summary for the instructor: counts on the first line, one line per skip reason."""
        text = f"成绩库 {self.where}：写入 {self.written} 份分数"
        if self.unchanged:
            text += f"，{self.unchanged} 份与成绩库里的相同（未改动）"
        if self.manual:
            text += f"；{len(self.manual)} 份有人工评分，人工分保留不动、成绩以它为准"
        text += f"；跳过 {len(self.skipped)} 份"
        reasons: dict[str, list[str]] = defaultdict(list)
        for who, reason in self.skipped:
            reasons[reason].append(who)
        for reason, whos in reasons.items():
            more = f" 等 {len(whos)} 份" if len(whos) > 5 else ""
            text += f"\n  {reason}：{'、'.join(whos[:5])}{more}"
        if self.error:
            text += (f"\n  没有写完：{self.error}；还有 {self.unwritten} 份没有写。CSV 已写好，"
                     "用相同的命令重跑即可补写（不会重新评分）")
        return text


def _who(row: dict) -> str:
    return f"{row.get('student')}/{row.get('exercise')}"


def _pick(rows) -> tuple[list[dict], list[tuple[str, str]]]:
    """One row per (student, exercise): of several, the one named <id>.ipynb (nbgrader's
    notebook); if that does not settle it, none."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row.get("student"), row.get("exercise"))].append(row)
    chosen, skipped = [], []
    for (_, exercise), group in groups.items():
        named = [r for r in group if Path(str(r.get("path", ""))).name == f"{exercise}.ipynb"]
        if len(group) == 1 or len(named) == 1:
            chosen.append(group[0] if len(group) == 1 else named[0])
            skipped += [(_who(r), OTHER_FILE) for r in group if r is not chosen[-1]]
        else:
            skipped += [(_who(r), TWO_FILES) for r in group]
    return chosen, skipped


def _number(value) -> float | None:
    """A finite number from a row's field (the CSV's rows hold strings), or None."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _shown(db_url: str) -> str:
    """The gradebook as the instructor named it: a path relative to here where it can be."""
    path = db_url.removeprefix("sqlite:///")
    if path == db_url:
        return db_url
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _timestamp(row: dict):
    """nbgrader's submission time from timestamp.txt beside the file, if it has one."""
    from nbgrader.utils import parse_utc

    try:
        text = (Path(str(row.get("path", ""))).parent / "timestamp.txt").read_text(encoding="utf-8").strip()
        return parse_utc(text) if text else None
    except (OSError, ValueError, OverflowError):
        return None


def _write_one(gb, row: dict, score: float, summary: Summary) -> str | None:
    """Set this row's auto_score; the reason it was skipped, or None. Commits on success."""
    from nbgrader.api import MissingEntry
    from sqlalchemy.exc import SAWarning

    from .autograde import CHECK_SUFFIX

    student, exercise = str(row["student"]), str(row["exercise"])
    cell_name = exercise + CHECK_SUFFIX
    try:
        gb.find_assignment(exercise)
    except MissingEntry:
        return NO_ASSIGNMENT
    try:
        gb.find_student(student)
    except MissingEntry:
        return NO_STUDENT
    try:
        cell = gb.find_grade_cell(cell_name, exercise, exercise)
    except MissingEntry:
        return NO_CELL
    top = _number(row.get("max_score"))
    if top is not None and not math.isclose(top, float(cell.max_score or 0)):
        return (f"成绩库里这一格满分 {cell.max_score:g}，评分器的满分 {top:g}：分数不能直接记入"
                "（重新运行 nbgrader generate_assignment <编号> 更新成绩库）")
    try:
        gb.find_submission(exercise, student)
    except MissingEntry:
        stamp = _timestamp(row)
        with warnings.catch_warnings():     # nbgrader 0.9 builds the submission before adding it: harmless SAWarnings
            warnings.simplefilter("ignore", SAWarning)
            gb.add_submission(exercise, student, **({"timestamp": stamp} if stamp else {}))
    grade = gb.find_grade(cell_name, exercise, exercise, student)
    before = (grade.auto_score, grade.needs_manual_grade)
    manual = grade.manual_score is not None
    if manual and grade.auto_score != score:
        grade.needs_manual_grade = True           # the formgrader lists it: the automatic score moved
    elif not manual:
        grade.needs_manual_grade = False
    grade.auto_score = score
    changed = (grade.auto_score, grade.needs_manual_grade) != before
    gb.db.commit()
    if changed:
        summary.written += 1
    else:
        summary.unchanged += 1
    if manual:
        summary.manual.append(_who(row))
    return None


def write(rows, db_url: str, where: str | None = None) -> Summary:
    """Write every row's score into the gradebook at `db_url` (see the module doc). Never raises
    for the gradebook's contents or errors: they end up in the summary."""
    from sqlalchemy.exc import SQLAlchemyError
    from nbgrader.api import Gradebook, InvalidEntry

    rows = list(rows)
    summary = Summary(where or _shown(db_url))
    summary.skipped = [(_who(r), NO_EXERCISE) for r in rows if not r.get("exercise")]
    chosen, twice = _pick([r for r in rows if r.get("exercise")])
    summary.skipped += twice
    todo = []
    for row in chosen:
        score = None if row.get("category") == "grader_error" else _number(row.get("score"))
        if score is None:
            summary.skipped.append((_who(row), NO_SCORE))
        else:
            todo.append((row, score))
    gb = None
    try:
        gb = Gradebook(db_url, course_id="")       # "": check_course adds no course row
        for done, (row, score) in enumerate(todo):
            try:
                reason = _write_one(gb, row, score, summary)
            except (SQLAlchemyError, InvalidEntry) as e:
                gb.db.rollback()
                summary.error, summary.unwritten = db_error_zh(e), len(todo) - done
                break
            if reason:
                summary.skipped.append((_who(row), reason))
    except SQLAlchemyError as e:                # opening it: not a gradebook, locked, unreachable
        summary.error, summary.unwritten = db_error_zh(e), len(todo)
    finally:
        if gb is not None:
            gb.close()
    return summary
