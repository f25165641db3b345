"""`vramlab.check(exercise_id)`: grade, from a notebook, the function the learner just wrote.

    def train_step(model, optimizer, batch, device):
        ...
    vramlab.check("ch05-accumulation")          # prints Chinese feedback; AssertionError if it fails

The function's source (inspect.getsource works for IPython cells) and the imports it uses from the
notebook's globals are written to a small module, which goes through the same isolated subprocess
grader as `vramlab grade`. The function must not depend on other notebook state.
"""
from __future__ import annotations

import inspect
import textwrap
import types

HEADER = "import torch\nimport torch.nn.functional as F\n"


def _imports_for(func) -> list[str]:
    """`import ...` lines for the modules and imported callables the function names globally, and
    assignments for the plain constants (numbers, strings) it reads from the notebook."""
    lines = []
    g = getattr(func, "__globals__", {})
    names = set(func.__code__.co_names)
    for const in func.__code__.co_consts:          # nested functions / comprehensions
        if isinstance(const, types.CodeType):
            names |= set(const.co_names)
    for name in sorted(names):
        if name not in g:
            continue
        v = g[name]
        if isinstance(v, types.ModuleType):
            lines.append(f"import {v.__name__} as {name}" if v.__name__ != name else f"import {name}")
        elif callable(v) and getattr(v, "__module__", None) and getattr(v, "__module__") not in ("__main__",) \
                and getattr(v, "__name__", None) and not getattr(v, "__module__", "").startswith(("vramlab.exercises", "vramlab.grader", "vramlab.notebook_check")):
            mod, qual = v.__module__, v.__name__
            lines.append(f"from {mod} import {qual} as {name}" if qual != name else f"from {mod} import {name}")
        elif _is_literal(v):                       # notebook constants such as SEED = 0
            lines.append(f"{name} = {v!r}")
    return lines


def _is_literal(v) -> bool:
    if isinstance(v, (tuple, list)):
        return all(_is_literal(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def function_source(func, function_name: str) -> str:
    src = textwrap.dedent(inspect.getsource(func))
    parts = [HEADER, *_imports_for(func), "", src]
    if func.__name__ != function_name:
        parts.append(f"\n{function_name} = {func.__name__}\n")
    return "\n".join(parts) + "\n"


def check(exercise_id: str, func=None, backend: str = "sim", scale: str = "ci", quiet: bool = False) -> dict:
    from .exercises import get_exercise
    from .grader import grade_source
    from .grader.report import format_result

    spec = get_exercise(exercise_id)
    if func is None:
        import __main__
        func = getattr(__main__, spec.function, None)
        if func is None:
            raise AssertionError(f"没有找到函数 `{spec.function}`：请先运行定义它的代码单元，并保留题目给出的函数名")
    if not callable(func):
        raise AssertionError(f"`{spec.function}` 不是函数")
    try:
        source = function_source(func, spec.function)
    except (OSError, TypeError) as e:
        raise AssertionError(f"读不到函数 `{spec.function}` 的源代码（{e}）：请在 notebook 的代码单元里定义它") from None
    result = grade_source(exercise_id, source, backend=backend, scale=scale)
    if not quiet:
        print(format_result(result))
    if not result["passed"]:
        raise AssertionError(result["reason"])
    return result


__all__ = ["check", "function_source"]
