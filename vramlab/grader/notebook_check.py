"""`vramlab.check(exercise_id)`: grade, from a notebook, the function the learner just wrote.

    def train_step(model, optimizer, batch, device):
        ...
    vramlab.check("ch05-accumulation")          # prints Chinese feedback; AssertionError if it fails

The function's source (inspect.getsource works for IPython cells) and the imports it uses from the
notebook's globals are written to a small module, which goes through the same isolated subprocess
grader as `vramlab grade`. Globals it reads come along when they can be rebuilt in another process:
imports, helper functions defined in the notebook, and literals (`SEED = 0`, `_cache = {}`); any
other notebook state (a tensor, a model) is refused with an AssertionError naming it.
"""
from __future__ import annotations

import dis
import inspect
import math
import os
import textwrap
import types

from .submission import FORBIDDEN_MODULES

HEADER = "import torch\nimport torch.nn.functional as F\n"


def _global_reads(code: types.CodeType) -> list[str]:
    """Globals a code object and the functions, lambdas and comprehensions nested in it read
    (co_names would also list attribute names: `batch.data` is not the global `data`)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_reads(const))
    return sorted(names)


def _literal_source(v) -> str | None:
    """Source that rebuilds `v`: numbers, strings, None, and list/tuple/set/dict of them; else None."""
    if v is None or type(v) in (bool, int, str, bytes):
        return repr(v)
    if type(v) is float:
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"     # repr(inf) is not Python
    if type(v) not in (list, tuple, set, frozenset, dict):
        return None
    flat = [x for kv in v.items() for x in kv] if type(v) is dict else list(v)
    items = [_literal_source(x) for x in flat]
    if None in items:
        return None
    if type(v) is dict:
        return "{" + ", ".join(f"{k}: {x}" for k, x in zip(items[::2], items[1::2])) + "}"
    inner = ", ".join(items)
    return {list: f"[{inner}]", tuple: f"({inner}{',' if len(items) == 1 else ''})",
            set: f"{{{inner}}}" if items else "set()", frozenset: f"frozenset({{{inner}}})"}[type(v)]


def _helper_source(name: str, v) -> str:
    """The source of a function or class defined in the notebook, to be sent along."""
    try:
        return textwrap.dedent(inspect.getsource(v))
    except (OSError, TypeError):
        raise AssertionError(f"读不到 notebook 里 `{name}` 的源代码，无法把它带进独立的评分进程："
                             "请把它写在评分函数内部") from None


def _code_of(v) -> list[types.CodeType]:
    """The code a notebook function or class runs (a class: its methods)."""
    if inspect.isfunction(v):
        return [inspect.unwrap(v).__code__]
    members = [getattr(m, "__func__", getattr(m, "fget", m)) for m in vars(v).values()]
    return [m.__code__ for m in members if inspect.isfunction(m)]


def _is_notebook_definition(v) -> bool:
    return (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == "__main__" \
        and v.__name__ != "<lambda>"


def _is_importable(v) -> bool:
    module, name = getattr(v, "__module__", None), getattr(v, "__name__", None)
    return callable(v) and isinstance(module, str) and isinstance(name, str) and module not in ("", "__main__") \
        and not module.startswith(FORBIDDEN_MODULES)


def _unreproducible_zh(reader: str, name: str, v) -> str:
    return (f"`{reader}` 用到了 notebook 里的全局变量 `{name}`（{type(v).__name__} 对象），它无法带进独立的评分进程："
            "评分器只带上导入、函数定义，以及数字、字符串和由它们组成的 list/dict/set/tuple。"
            f"请在函数内部创建 `{name}`（例如在函数里构建张量或模型），或者把它改成字面量")


def _module_parts(func) -> tuple[list[str], list[str]]:
    """`import` lines and constant assignments for the globals the function reads (following the
    notebook helpers it calls), and the helpers' sources. AssertionError for a global that cannot
    be rebuilt in another process (a tensor, a model): better than a NameError inside the grader."""
    lines, helpers = [], []
    seen, todo = {func.__name__}, [(func.__name__, inspect.unwrap(func).__globals__, _code_of(func))]
    while todo:
        reader, g, codes = todo.pop(0)
        for name in sorted({n for code in codes for n in _global_reads(code)} - seen):
            seen.add(name)
            if name not in g:
                continue                           # a builtin, or undefined in the kernel too
            v = g[name]
            if isinstance(v, types.ModuleType):
                lines.append(f"import {v.__name__} as {name}" if v.__name__ != name else f"import {name}")
            elif _is_notebook_definition(v):
                helpers.append(_helper_source(name, v))
                if v.__name__ != name:             # `step = my_step`: the source defines my_step
                    helpers.append(f"{name} = {v.__name__}\n")
                todo.append((name, g, _code_of(v)))
            elif _is_importable(v):
                lines.append(f"from {v.__module__} import {v.__name__} as {name}" if v.__name__ != name
                             else f"from {v.__module__} import {name}")
            elif (literal := _literal_source(v)) is not None:     # notebook constants: SEED = 0, _cache = {}
                lines.append(f"{name} = {literal}")
            else:
                raise AssertionError(_unreproducible_zh(reader, name, v))
    return lines, helpers


def function_source(func, function_name: str) -> str:
    src = textwrap.dedent(inspect.getsource(func))
    lines, helpers = _module_parts(func)
    parts = [HEADER, *lines, "", *helpers, src]
    if func.__name__ != function_name:
        parts.append(f"\n{function_name} = {func.__name__}\n")
    return "\n".join(parts) + "\n"


DEFERRED_MESSAGE = ("自动评分：这个单元格的得分由评分器在你的 kernel 之外，从提交的 notebook 重新测量后给出"
                    "（见下方“复评”）；这里不再测一次。")


def deferred() -> bool:
    """In autograde's sandboxed kernel with TrustedRegrade configured (grader/autograde.py), the
    kernel measures nothing: the score is decided outside it."""
    from .kernel import DEFER_ENV, INSIDE_ENV

    return os.environ.get(DEFER_ENV) == "1" and os.environ.get(INSIDE_ENV) == "1"


def show_figure(result: dict) -> bool:
    """Display the report's timeline figure (starter vs yours, allocated over the steps) inline when a
    Jupyter kernel runs this; plain Python prints the text report only. True when it was shown."""
    from .report import figure_of, memory_of

    svg = figure_of(result)
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return False
    shell = get_ipython()
    if not svg or shell is None or getattr(shell, "kernel", None) is None:
        return False
    _, hidden = memory_of(result)
    caption = ("隐藏配置里两次运行的已分配显存（以起始代码的峰值为 100%，不显示具体数值）" if hidden
               else "起始代码与你的代码每一步的已分配显存（模拟设备）")
    display(HTML(f'<figure style="margin:0.5em 0">{svg}<figcaption style="color:#495057;font-size:90%">'
                 f'{caption}：灰线是起始代码，蓝线是你的代码；圆点是每一步结束时的已分配显存，▼ 是峰值，'
                 f'✕ 是显存溢出，红色虚线是你的代码运行的显卡大小。</figcaption></figure>'))
    return True


def check(exercise_id: str, func=None, backend: str = "sim", scale: str = "ci", quiet: bool = False) -> dict:
    from ..exercises import get_exercise
    from . import grade_source
    from .report import format_result

    spec = get_exercise(exercise_id)
    if deferred():
        print(DEFERRED_MESSAGE)
        return {"exercise": spec.id, "deferred": True, "passed": None, "reason": DEFERRED_MESSAGE}
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
    from . import deadline      # the whole grading under a wall-clock deadline ($VRAMLAB_DEADLINE_S)

    result = deadline.run(lambda: grade_source(exercise_id, source, backend=backend, scale=scale),
                          exercise_id, backend, scale)
    if not quiet:
        print(format_result(result))
        show_figure(result)
    if not result["passed"]:
        raise AssertionError(result["reason"])
    return result


__all__ = ["check", "function_source", "show_figure"]
