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

A grader failure (no bubblewrap, a broken sandbox) raises: nbgrader records an error for that one
submission and goes on with the next; it is never scored as the learner's fault. One nbgrader
process grades the whole class, so every submission after the first finds a warm sandbox
(slots.py) and the starter's run in the cache (baselines.py).
"""
from __future__ import annotations

import os
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
    sandbox = Unicode("require", help="require：没有 bubblewrap 就报错（正式评分）；auto：只在信任提交者时用").tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        os.environ[DEFER_ENV] = "1"            # the kernels started from now on leave the grading to us

    def preprocess(self, nb, resources):
        from .core import grade_file
        from .report import format_result

        cells = [(cell, exercise_of(cell)) for cell in nb.cells
                 if cell.cell_type == "code" and utils.is_grade(cell)]
        if not any(eid for _, eid in cells):
            return nb, resources
        with tempfile.TemporaryDirectory(prefix="vramlab-autograde-") as tmp:
            for cell, eid in cells:
                if eid is None:
                    continue
                path = Path(tmp) / f"{eid}.ipynb"
                path.write_text(nbformat.writes(nb), encoding="utf-8")
                result = grade_file(eid, path, backend=self.backend, scale=self.scale,
                                    timeout_s=self.timeout, sandbox=self.sandbox)
                self.log.info("vramlab 复评 %s：%s（%s）", eid, "通过" if result.get("passed") else "未通过",
                              result.get("category"))
                rewrite_outputs(cell, result, format_result(result))
        return nb, resources


__all__ = ["TrustedRegrade", "exercise_of", "rewrite_outputs"]
