"""The score of a graded cell under `nbgrader autograde`, decided outside the learner's kernel.

autograde executes every cell of a submission in the sandboxed kernel (kernel.py). The sandbox
protects the course, not the score: the learner's top-level code runs in the same interpreter as
the check cell and can replace `vramlab.check`, `subprocess` or `sys.executable`. So the kernel
does not measure anything there (`vramlab.check` returns a deferred result when it sees
kernel.INSIDE_ENV), and `TrustedRegrade`, placed after Execute in nbgrader_config.py, grades the
notebook in the nbgrader process instead:

- what it grades is nbgrader's in-memory copy of the submitted notebook (locked cells already
  restored from the source), not the file in the kernel's folder, which the learner's code may
  have rewritten while it ran;
- it grades with `grade_file(..., sandbox="require")`, exactly what `vramlab grade` does;
- the kernel defers only when this step exists: constructing it sets kernel.DEFER_ENV, which the
  sandboxed kernel inherits. A course config without it keeps measuring in the kernel (forgeable,
  but never a free pass);
- it rewrites the graded cell's outputs: the kernel's own errors stay visible as text but no
  longer count, the grader's report is appended, and an error output is added when the function
  did not pass (nbgrader gives 0 to a graded cell with an error output, full points otherwise).

A grader failure (no bubblewrap, a broken sandbox, a full temp disk) raises: nbgrader records an
error for that one submission and goes on with the next; it is never scored as the learner's
fault. One nbgrader process grades the whole class, so every submission after the first finds a
warm sandbox (slots.py) and the starter's run in the cache (baselines.py).

Recovery after a crash. nbgrader decides to skip a submission by its folder in
nbgrader/autograded/ alone: an `nbgrader autograde` killed in the middle of one (SIGKILL, a node
lost, Ctrl-C twice) leaves that folder behind with the sanitized, ungraded notebook (nbgrader
writes it there before executing it) or a graded one cut short, and a plain rerun logs "Skipping
existing assignment" while the gradebook holds the submission without a score (0 in the export).
`half_graded()` finds such folders (a code grade cell without an automatic score in the
gradebook, or no complete notebook in the folder) and `recover()` removes them, so that the next
`nbgrader autograde` grades exactly those again.
nbgrader_config.py calls `before_nbgrader()` when nbgrader starts: `autograde` recovers first
(holding a lock, so a second autograde running at the same time is left alone), `export` warns
about what is still half graded. By hand:

    python -m vramlab.grader.autograde [ASSIGNMENT]          # list them; exit 1 if there are any
    python -m vramlab.grader.autograde --fix [ASSIGNMENT]    # remove them, then rerun nbgrader autograde
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Float, Unicode

from .kernel import DEFER_ENV

CHECK_SUFFIX = "-check"
REPORT_HEADER = "评分器在 kernel 之外的复评（得分以此为准）：\n"


def exercise_of(cell) -> str | None:
    """The exercise id of a graded check cell (grade_id "<id>-check"), or None."""
    from ..exercises import EXERCISES

    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
    eid = grade_id[: -len(CHECK_SUFFIX)] if grade_id.endswith(CHECK_SUFFIX) else None
    return eid if eid in EXERCISES else None


def rewrite_outputs(cell, result: dict, report: str) -> None:
    """Make the cell's outcome the grader's: kernel errors become text, the report is appended,
    and one error output is added when the grader did not pass the submission."""
    outputs = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            outputs.append(nbformat.v4.new_output(
                "stream", name="stdout",
                text=f"[kernel 里的错误，不计分] {out.get('ename', '')}: {out.get('evalue', '')}\n"))
        else:
            outputs.append(out)
    outputs.append(nbformat.v4.new_output("stream", name="stdout", text=REPORT_HEADER + report.rstrip() + "\n"))
    if not result.get("passed"):
        reason = result.get("reason") or "未通过"
        outputs.append(nbformat.v4.new_output("error", ename="AssertionError", evalue=reason,
                                              traceback=[f"AssertionError: {reason}"]))
    cell["outputs"] = outputs


class TrustedRegrade(NbGraderPreprocessor):
    """Autograde step: grade each exercise's check cell outside the kernel (see the module doc)."""

    backend = Unicode("sim", help="评分后端：sim（模拟设备）或 cuda").tag(config=True)
    scale = Unicode("ci", help="规模：ci 或 gpu（有 GPU 时与 backend=cuda 一起用）").tag(config=True)
    timeout = Float(None, allow_none=True, help="学员代码的运行时限（秒）；默认用规格里的").tag(config=True)
    deadline = Float(None, allow_none=True,
                     help="每个练习整份评分的总时限（秒）；默认取环境变量 VRAMLAB_DEADLINE_S，否则为每个用例的运行时限之和"
                          "再加 300 秒余量。超过的记为超时、0 分，接着评下一份").tag(config=True)
    sandbox = Unicode("require", help="require：没有 bubblewrap 就报错（正式评分）；auto：只在信任提交者时用").tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        for name in ("timeout", "deadline"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"c.TrustedRegrade.{name} 必须是大于 0 的有限秒数（或 None），收到 {value!r}")
        from .deadline import from_env

        from_env()                              # a bad $VRAMLAB_DEADLINE_S: said now, in Chinese
        os.environ[DEFER_ENV] = "1"            # the kernels started from now on leave the grading to us

    def preprocess(self, nb, resources):
        from . import deadline
        from .core import grade_file
        from .report import format_result

        cells = [(cell, exercise_of(cell)) for cell in nb.cells
                 if cell.cell_type == "code" and utils.is_grade(cell)]
        if not any(eid for _, eid in cells):
            return nb, resources
        from .sandbox import mark_owner

        with tempfile.TemporaryDirectory(prefix="vramlab-autograde-") as tmp:
            mark_owner(tmp)                    # SIGKILLed: the next grading removes it (sandbox.sweep_stale)
            for cell, eid in cells:
                if eid is None:
                    continue
                path = Path(tmp) / f"{eid}.ipynb"
                path.write_text(nbformat.writes(nb), encoding="utf-8")
                # under a wall-clock deadline: a grading past it is this submission's timeout (deadline.py)
                result = deadline.run(lambda: grade_file(eid, path, backend=self.backend, scale=self.scale,
                                                         timeout_s=self.timeout, sandbox=self.sandbox),
                                      eid, self.backend, self.scale, self.timeout, self.deadline)
                self.log.info("vramlab 复评 %s：%s（%s）", eid, "通过" if result.get("passed") else "未通过",
                              result.get("category"))
                rewrite_outputs(cell, result, format_result(result))
        return nb, resources


# -- recovery after a crash (see the module doc) ----------------------------------------------------

LOCK_NAME = ".vramlab-autograde.lock"
_held_lock = None          # the open lock file of this process's autograde, kept until it exits


def _course_dirs(root) -> tuple[Path, Path]:
    """(submitted, autograded) of the course at `root` (the layout of nbgrader_config.py)."""
    root = Path(root)
    return root / "nbgrader" / "submitted", root / "nbgrader" / "autograded"


def _valid_notebook(path: Path) -> bool:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(nb, dict) and isinstance(nb.get("cells"), list)


UNSCORED_SQL = """
    select sa.student_id, a.name from grade g
    join submitted_notebook sn on g.notebook_id = sn.id
    join submitted_assignment sa on sn.assignment_id = sa.id
    join assignment a on sa.assignment_id = a.id
    join grade_cells gc on g.cell_id = gc.id
    where g.auto_score is null and gc.cell_type = 'code'
"""


def _unscored(root) -> set[tuple[str, str]]:
    """(student, assignment) of the submissions whose code grade cells have no automatic score in
    the gradebook (nbgrader 0.9's schema, read-only; an unreadable gradebook: none)."""
    import sqlite3

    db = Path(root) / "nbgrader" / "gradebook.db"
    if not db.is_file():
        return set()
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return {(str(st), str(a)) for st, a in con.execute(UNSCORED_SQL)}
        finally:
            con.close()
    except sqlite3.Error:
        return set()


def half_graded(root, assignment: str | None = None, student: str | None = None) -> list[tuple[str, str, str]]:
    """(student, assignment, why) for every graded folder whose grading did not finish: an
    autograde was killed while grading it (see the module doc)."""
    submitted, autograded = _course_dirs(root)
    unscored = _unscored(root)
    found = []
    for folder in sorted(autograded.glob(f"{student or '*'}/{assignment or '*'}")):
        if not folder.is_dir():
            continue
        who, what = folder.parent.name, folder.name
        if (who, what) in unscored:
            found.append((who, what, "成绩库里没有分数"))
            continue
        for nb in sorted((submitted / who / what).glob("*.ipynb")):
            graded = folder / nb.name
            if not graded.exists():
                found.append((who, what, f"没有评分后的 {nb.name}"))
                break
            if not _valid_notebook(graded):
                found.append((who, what, f"评分后的 {nb.name} 只写了一半"))
                break
    return found


def recover(root, assignment: str | None = None, student: str | None = None) -> list[tuple[str, str, str]]:
    """Remove the half-graded folders (`half_graded`), so that the next `nbgrader autograde` grades
    those submissions again (the submitted files are not touched); what was removed."""
    import shutil

    _, autograded = _course_dirs(root)
    found = half_graded(root, assignment, student)
    for who, what, _ in found:
        shutil.rmtree(autograded / who / what, ignore_errors=True)
    return found


def _lock(root) -> bool:
    """Hold the course's autograde lock for the rest of this process; False if another holds it."""
    global _held_lock
    if _held_lock is not None:
        return True
    try:
        import fcntl
    except ImportError:          # pragma: no cover - not POSIX: no lock, recover anyway
        return True
    path = Path(root) / "nbgrader" / LOCK_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    _held_lock = f
    return True


NO_VALUE = {"--force", "--create", "--no-execute", "--debug", "--quiet", "--help", "-h", "--help-all", "--version",
            "--no-input", "-y"}      # nbgrader's flags: the word after one of them is not its value


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def before_nbgrader(root, argv: list[str]) -> None:
    """Called by nbgrader_config.py with nbgrader's arguments. `autograde`: remove half-graded
    folders of the assignment (and --student) it is about to grade, so that it grades them again;
    `export`: warn about half-graded submissions (they would be exported with 0 points)."""
    if not argv:
        return
    command, rest = argv[0], argv[1:]
    positional = [a for i, a in enumerate(rest) if not a.startswith("-")
                  and not (i and rest[i - 1].startswith("-") and "=" not in rest[i - 1] and rest[i - 1] not in NO_VALUE)]
    assignment = _option(rest, "--assignment") or (positional[0] if positional else None)
    if command == "autograde":
        if "--force" in rest:
            return                              # nbgrader regrades everything it is given anyway
        if not _lock(root):
            print("vramlab：另一个 nbgrader autograde 正在评这个课程，这次不检查半截的评分", file=sys.stderr)
            return
        for who, what, why in recover(root, assignment, _option(rest, "--student")):
            print(f"vramlab：{who}/{what} 上次没有评完（{why}，评分进程被中断过），这次重新评分", file=sys.stderr)
    elif command == "export":
        found = half_graded(root)
        for who, what, why in found:
            print(f"vramlab 警告：{who}/{what} 没有评完（{why}），导出的是 0 分；先运行 nbgrader autograde {what}"
                  " 补评（它会自动重评没评完的提交），再导出", file=sys.stderr)


def main(argv=None) -> int:
    from ..args import ChineseArgumentParser

    p = ChineseArgumentParser(prog="python -m vramlab.grader.autograde",
                              description="找出 nbgrader autograde 被中断后没评完的提交（--fix：删掉它们的评分文件夹，"
                                          "下一次 nbgrader autograde 就会重新评分）")
    p.add_argument("assignment", nargs="?", help="作业（练习）编号；默认全部")
    p.add_argument("--student", help="只看这个学号")
    p.add_argument("--root", default=".", help="课程目录（nbgrader_config.py 所在的文件夹，默认当前目录）")
    p.add_argument("--fix", action="store_true", help="删掉没评完的评分文件夹，以便重评")
    args = p.parse_args(argv)
    if not (Path(args.root) / "nbgrader_config.py").is_file():
        print(f"错误：{args.root} 里没有 nbgrader_config.py：请在课程目录里运行，或用 --root 指定", file=sys.stderr)
        return 2
    if args.fix and not _lock(args.root):
        print("错误：另一个 nbgrader autograde 正在运行：等它结束后再修复", file=sys.stderr)
        return 4
    found = (recover if args.fix else half_graded)(args.root, args.assignment, args.student)
    for who, what, why in found:
        print(f"{who}/{what}：{why}" + ("，已删除评分文件夹" if args.fix else ""))
    if not found:
        print("没有没评完的提交。")
        return 0
    if args.fix:
        print(f"请运行 nbgrader autograde {args.assignment or '<编号>'} 重新评这 {len(found)} 份。")
        return 0
    print(f"共 {len(found)} 份没评完：运行 nbgrader autograde（会自动重评它们），或用 --fix 删掉它们的评分文件夹。")
    return 1


__all__ = ["TrustedRegrade", "before_nbgrader", "exercise_of", "half_graded", "recover", "rewrite_outputs"]

if __name__ == "__main__":
    sys.exit(main())
