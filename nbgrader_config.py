"""nbgrader configuration of the vramlab course (nbgrader 0.9).

Layout (directory_structure = "{nbgrader_step}/{student_id}/{assignment_id}"; one assignment = one
exercise id, one notebook per assignment, named after the id):

    solutions/<id>/<id>.ipynb             source notebooks, generated from the specs (committed)
    exercises/<id>/<id>.ipynb             release = learner notebooks (`nbgrader generate_assignment`, committed)
    nbgrader/submitted/<student>/<id>/    collected submissions            } gitignored
    nbgrader/autograded/<student>/<id>/   executed + graded copies         }
    nbgrader/feedback/<student>/<id>/     HTML feedback                    }
    nbgrader/gradebook.db                 the gradebook (SQLite)           }

Every path is relative to the folder holding this file, so a copy of the course (a temp dir, a
grading node) is self-contained: run nbgrader from that folder.
"""
import os

from vramlab.grader.autograde import TrustedRegrade  # noqa: E402  (needs the venv where vramlab is installed)
from vramlab.grader.kernel import SandboxedExecute  # noqa: E402
from vramlab.notebooks import StderrToStdout  # noqa: E402

_ROOT = os.path.dirname(os.path.abspath(__file__))

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

# --- course and directories ------------------------------------------------------------------------
c.CourseDirectory.course_id = "vramlab"
c.CourseDirectory.root = _ROOT
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = os.path.join("nbgrader", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("nbgrader", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("nbgrader", "feedback")
c.CourseDirectory.solution_directory = os.path.join("nbgrader", "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join("nbgrader", "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(_ROOT, "nbgrader", "gradebook.db")
os.makedirs(os.path.join(_ROOT, "nbgrader"), exist_ok=True)   # SQLite creates the file, not the folder
# nbgrader's default ignore list also skips "feedback"; keep it and add our own clutter, and the
# reference solution's source (solutions/<id>/solution.py): generate_assignment copies every other
# file of a source folder into the learners' release.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".vramlab", "solution.py"]

# --- recovery after a crash ------------------------------------------------------------------------
# An autograde killed while grading a submission leaves its nbgrader/autograded/ folder without the
# graded notebook; nbgrader alone would skip it from then on ("Skipping existing assignment") and
# export 0 points. Before `autograde`, vramlab removes such folders so that they are graded again;
# before `export`, it warns about any that are left (vramlab/grader/autograde.py, before_nbgrader).
import sys  # noqa: E402

from vramlab.grader.autograde import before_nbgrader  # noqa: E402

before_nbgrader(_ROOT, sys.argv[1:])

# --- the learner keeps a runnable starter ------------------------------------------------------------
# The answer cell of a source notebook holds the spec's STARTER outside the solution markers and the
# reference SOLUTION inside them (it redefines the same function). generate_assignment removes the
# marked region and puts this stub in its place, so the learner notebook runs as-is: correct, but
# over the memory target. No `raise NotImplementedError()`.
c.ClearSolutions.code_stub = {
    "python": "# ↑ 直接修改上面的函数：结果保持不变，把峰值显存降到目标以下。",
}
c.ClearSolutions.text_stub = "在这里写你的回答。"

# --- execution: per-cell timeout ---------------------------------------------------------------------
# Under autograde the graded cell measures nothing in the kernel (TrustedRegrade grades, see below),
# so a cell takes seconds; the timeout bounds a submission whose top-level code loops forever: it
# costs at most 300 s per cell, is recorded as a CellTimeoutError (0 points) and the batch goes on.
# Under `nbgrader validate` (the ordinary kernel) the cell does measure: a few seconds to ~40 s on
# 2 CPU cores at the ci scale.
c.Execute.timeout = 300
c.ExecutePreprocessor.timeout = 300
c.Execute.startup_timeout = 120          # first `import torch` on a cold node
c.Execute.interrupt_on_timeout = True
c.Execute.execute_retries = 0

# --- stderr must not turn a correct answer into 0 points ----------------------------------------------
# nbgrader 0.9 `utils.determine_grade` gives 0 to a graded cell that has ANY stream output named
# "stderr" (PyTorch / transformers warnings qualify). Two layers:
#   1. the graded cell itself runs check() under `contextlib.redirect_stderr(sys.stdout)`, so Python
#      warnings raised while checking show as plain output (also under `nbgrader validate`, which
#      has no configurable preprocessors);
#   2. autograde: StderrToStdout, placed right after Execute, relabels any stderr stream left in a
#      graded cell as stdout (text kept, prefixed "[stderr]"), so only a real exception (an "error"
#      output: failed assertion, timeout, crash) costs points. Like nbgrader's own IgnorePattern
#      (jupyter/nbgrader#1904), but without throwing the text away.
c.Autograde.autograde_preprocessors = [
    SandboxedExecute,                   # nbgrader's Execute, in the sandboxed kernel (see below)
    StderrToStdout,
    TrustedRegrade,                     # the score: graded outside the kernel (see below)
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.LimitOutput.max_lines = 400

# --- autograde runs the learner's notebook in the grading sandbox ----------------------------------------
# Autograde executes every cell of a submission, top-level code included, on this machine. SandboxedExecute
# (vramlab/grader/kernel.py) starts the kernel `vramlab-sandbox` (installed into this venv on first use)
# whatever kernelspec the notebook names: ipykernel under bubblewrap, with the notebook's folder
# nbgrader/autograded/<student>/<id>/ as its only visible and writable part of the course (solutions/,
# other submissions and gradebook.db are absent). After the kernel stops it removes the links and
# special files the learner left there. Without bubblewrap every submission fails to start, with a Chinese
# message in the log; set this to False only to grade trusted submissions on such a machine:
c.SandboxedExecute.require_sandbox = True
# `nbgrader validate` and the learners' own Jupyter keep the notebooks' ordinary `python3` kernel.

# --- the score comes from outside the kernel ---------------------------------------------------------------
# The sandbox protects the course, not the score: the learner's top-level code shares the kernel with
# the check cell and could replace vramlab.check. TrustedRegrade (vramlab/grader/autograde.py) grades
# each submission's function in this nbgrader process, in the grader's own sandbox, from nbgrader's
# copy of the notebook, and makes the check cell's outcome its verdict (kernel errors are kept as
# text, an error output is added when the function did not pass). While it is configured the kernel's
# vramlab.check() only says so. One process grades the class: warm sandboxes and the starter's cached
# run are shared by every submission. With a GPU: backend "cuda", scale "gpu".
c.TrustedRegrade.backend = "sim"
c.TrustedRegrade.scale = "ci"
c.TrustedRegrade.sandbox = "require"        # "auto" only together with require_sandbox = False above

# --- feedback ------------------------------------------------------------------------------------------
# generate_feedback renders the autograded notebook to HTML: the Chinese messages that check() prints
# (ratio, peak, hints) appear under the graded cell. Note: nbgrader 0.9 shows the graded cell as it
# was executed, hidden tests included, in the feedback (after the deadline that is fine).


# --- what nbgrader gets wrong for this course (vramlab/grader/nbplugins.py) ---------------------------
# `nbgrader export` writes only the assignments that were handed in (or those named with --assignment),
# not a 0 for each of the 33 exercises generate_assignment put in the gradebook.
from vramlab.grader.nbplugins import AssignedCsvExport, RestoreHiddenTests  # noqa: E402

c.ExportApp.plugin_class = AssignedCsvExport
# Autograde: nbgrader's checksum of a locked cell is taken before the hidden tests are removed, so an
# untouched submission used to warn "Attribute 'checksum' ... has changed!" (jupyter/nbgrader#1961);
# RestoreHiddenTests restores the hidden tests like nbgrader and keeps the warning for changed cells only.
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    RestoreHiddenTests,
    "nbgrader.preprocessors.CheckCellMetadata",
]
