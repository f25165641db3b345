"""The course grader: runs a learner's function in an OS sandbox (bubblewrap) on the simulated (or a
real) device and compares its peak memory and results with the exercise's starter code.

    from vramlab.grader import grade_file, grade_source
    result = grade_file("ch05-accumulation", "exercises/ch05-accumulation/ch05-accumulation.ipynb")
    result["passed"], result["score"], result["reason"]

Importing this package is cheap: the heavy parts load on first use.
"""
from __future__ import annotations


def grade_file(exercise_id, path, backend="sim", scale="ci", timeout_s=None, memory_limit_bytes=None,
               reuse_baseline=True, sandbox="auto", cores=None) -> dict:
    from .core import grade_file as _grade_file
    return _grade_file(exercise_id, path, backend=backend, scale=scale, timeout_s=timeout_s,
                       memory_limit_bytes=memory_limit_bytes, reuse_baseline=reuse_baseline, sandbox=sandbox, cores=cores)


def grade_source(exercise_id, source: str, backend="sim", scale="ci", timeout_s=None, memory_limit_bytes=None,
                 reuse_baseline=True, sandbox="auto", cores=None) -> dict:
    from .core import grade_source as _grade_source
    return _grade_source(exercise_id, source, backend=backend, scale=scale, timeout_s=timeout_s,
                         memory_limit_bytes=memory_limit_bytes, reuse_baseline=reuse_baseline, sandbox=sandbox, cores=cores)


def __getattr__(name):
    if name in ("GraderError", "SubmissionError", "CATEGORY_ZH"):
        from . import core
        return getattr(core, name)
    raise AttributeError(name)


__all__ = ["grade_file", "grade_source", "GraderError"]
