"""Reading a learner's submission: a `.py` file as it is, or the code cells of a notebook.

A notebook is not run top to bottom: in a fresh process the grader keeps only what is safe to run
at import (imports, function and class definitions, assignments that call nothing) and leaves out
calls, loops, demo runs, the `vramlab.check()` cell, magics and shell lines. A global that the
graded function needs but only left-out code defines would die as a bare NameError inside the
sandbox, so it is found here, statically, and reported in Chinese before anything runs.
"""
from __future__ import annotations

import ast
import builtins
import json
import os
import re
import symtable
from dataclasses import dataclass, field
from pathlib import Path

FORBIDDEN_MODULES = ("vramlab.exercises", "vramlab.grader")
BUILTINS = frozenset(dir(builtins))
# Calls that only build a container (or bind arguments to a function): safe to run at import.
PURE_CALLS = frozenset({"dict", "list", "set", "tuple", "frozenset", "object", "collections.OrderedDict",
                        "collections.defaultdict", "collections.Counter", "collections.deque", "functools.partial"})
# `files = !ls`, `t = %timeit -o f()`: IPython assignments from a shell line or a magic.
_MAGIC_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*[!%]")
_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
KEPT_ZH = ("评分器在独立进程里只运行 notebook 中的导入、函数和类定义，以及不调用函数的简单赋值"
           "（例如 `_cache = {}`、`SIZES = [1, 2]`），其余语句（函数调用、循环、演示代码、检查单元格）都会跳过")


class SubmissionError(Exception):
    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category, self.reason = category, reason


@dataclass
class _Statement:
    """One top-level statement of a code cell, with where the learner sees it."""
    text: str
    cell: int          # counts code cells only, from 1: the order the learner sees them in
    line: int          # inside the cell, from 1

    def where(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        first = first if len(first) <= 60 else first[:57] + "..."
        return f"第 {self.cell} 个代码单元第 {self.line} 行（`{first}`）"


@dataclass
class _Module:
    """The kept code, what it defines and what the left-out code would have defined."""
    parts: list[str] = field(default_factory=list)
    reads: dict[str, set[str]] = field(default_factory=dict)       # kept name -> globals its statement reads
    dropped: dict[str, _Statement] = field(default_factory=dict)   # name -> last left-out statement binding it
    # local name -> dotted origin, to recognise PURE_CALLS however they were imported
    aliases: dict[str, str] = field(default_factory=lambda: {n: n for n in PURE_CALLS if "." not in n})
    star: bool = False                                              # `from x import *`: any name may exist

    def add(self, node: ast.stmt, st: _Statement) -> None:
        binds, reads = _scope(st.text)
        if isinstance(node, ast.AnnAssign) and node.value is None:
            binds = set()                  # `x: int` only annotates; x stays undefined
        if not isinstance(node, _DEFINITIONS):
            reads |= _augmented(node)
        if not self._runs_safely(node, binds, reads):
            self.dropped.update(dict.fromkeys(binds, st))
            return
        self.parts.append(st.text)
        for name in binds:
            self.reads[name] = reads
            self.aliases.pop(name, None)   # a rebound `dict` is no longer the builtin
        self._track_imports(node)

    def _runs_safely(self, node: ast.stmt, binds: set[str], reads: set[str]) -> bool:
        if isinstance(node, _DEFINITIONS):
            return True
        if not _is_simple(node, self.aliases):
            return False
        # an assignment must only read what already exists when it runs; an if/try may define its own
        known = set(self.reads) | BUILTINS | (binds if isinstance(node, (ast.If, ast.Try)) else set())
        return self.star or reads <= known

    def _track_imports(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                local = a.asname or a.name.split(".")[0]
                self.aliases[local] = a.name if a.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                self.star |= a.name == "*"
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def source(self) -> str:
        # `from __future__` must open the module, wherever the learner's cell put it
        future = [p for p in self.parts if p.startswith("from __future__")]
        return "\n\n".join(future + [p for p in self.parts if p not in future]) + "\n"


def _scope(text: str) -> tuple[set[str], set[str]]:
    """Names a top-level statement binds, and the globals it (and code nested in it) reads."""
    try:
        table = symtable.symtable(text, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return set(), set()
    binds = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    reads, global_writes = _globals_of(table)
    return binds | global_writes, reads


def _augmented(node: ast.stmt) -> set[str]:
    """`n += 1` reads n before it stores it; symtable only counts the store."""
    return {n.target.id for n in ast.walk(node) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}


def _globals_of(table: symtable.SymbolTable) -> tuple[set[str], set[str]]:
    """Global names read in a scope and its nested scopes, and those a `global` statement assigns
    (counted as defined: the function that assigns them may well have been called first)."""
    symbols = table.get_symbols()
    reads = {s.get_name() for s in symbols if s.is_referenced() and s.is_global()}
    writes = {s.get_name() for s in symbols if s.is_declared_global() and s.is_assigned()}
    for child in table.get_children():
        r, w = _globals_of(child)
        reads, writes = reads | r, writes | w
    return reads, writes


def _is_simple(node: ast.stmt, aliases: dict[str, str]) -> bool:
    """An assignment that calls nothing but PURE_CALLS, or an if/try made only of such statements
    (and definitions), e.g. `try: import apex` / `except ImportError: apex = None`."""
    if isinstance(node, (*_DEFINITIONS, ast.Pass)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return _calls_nothing(node, aliases)
    if isinstance(node, ast.If):
        return _calls_nothing(node.test, aliases) and all(_is_simple(n, aliases) for n in node.body + node.orelse)
    if isinstance(node, ast.Try):
        handlers = all((h.type is None or _calls_nothing(h.type, aliases)) and all(_is_simple(n, aliases) for n in h.body)
                       for h in node.handlers)
        return handlers and all(_is_simple(n, aliases) for n in node.body + node.orelse + node.finalbody)
    return False


def _calls_nothing(node: ast.AST, aliases: dict[str, str]) -> bool:
    """No call in `node` but PURE_CALLS (`functools.partial` only of a named function); no await/yield."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(sub, ast.Call):
            callee = _dotted(sub.func, aliases)
            if callee not in PURE_CALLS:
                return False
            if callee == "functools.partial" and not (sub.args and isinstance(sub.args[0], (ast.Name, ast.Attribute))):
                return False
    return True


def _dotted(expr: ast.expr, aliases: dict[str, str]) -> str | None:
    """`collections.OrderedDict` for `OrderedDict`, `collections.OrderedDict` or `c.OrderedDict`."""
    attrs = []
    while isinstance(expr, ast.Attribute):
        attrs.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or expr.id not in aliases:
        return None
    return ".".join([aliases[expr.id], *reversed(attrs)])


def _code_cells(text: str) -> list[str]:
    try:
        nb = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SubmissionError("invalid_submission", f"notebook 文件不是合法的 JSON，无法读取（{e.msg if hasattr(e, 'msg') else e}）："
                              "请在 Jupyter 里重新保存，或从 exercises/ 重新复制一份") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SubmissionError("invalid_submission", "notebook 文件缺少 cells 字段，不是 Jupyter notebook")
    cells = [c for c in nb["cells"] if isinstance(c, dict) and c.get("cell_type") == "code"]
    return ["".join(s) if isinstance(s, list) else str(s) for s in (c.get("source", "") for c in cells)]


def _strip_magics(src: str, cell: int, module: _Module) -> str:
    """Comment out magics and shell lines, keeping line numbers; what they assign is left out."""
    lines = src.splitlines()
    for i, line in enumerate(lines):
        assigned = _MAGIC_ASSIGN.match(line)
        if assigned or line.lstrip().startswith(("%", "!")):
            names = assigned.group(1).split(",") if assigned else []
            module.dropped.update(dict.fromkeys((n.strip() for n in names), _Statement(line, cell, i + 1)))
            lines[i] = "# " + line
    return "\n".join(lines)


def _segment(src: str, node: ast.stmt) -> tuple[str, int]:
    """A statement's source and first line, decorators included (get_source_segment starts at `def`)."""
    decorators = getattr(node, "decorator_list", [])
    if not decorators:
        return ast.get_source_segment(src, node) or "", node.lineno
    first = decorators[0].lineno
    return "\n".join(src.splitlines()[first - 1:node.end_lineno]), first


def notebook_source(text: str, function: str) -> str:
    """The code of a notebook that the grader runs (see the module docstring). Cells that do not
    parse are skipped, unless the graded function is in one of them. Raises SubmissionError when
    the graded function (or a helper it reaches) reads a global that the kept code does not define."""
    module = _Module()
    syntax_error = None
    for number, src in enumerate(_code_cells(text), 1):
        src = _strip_magics(src, number, module)
        try:
            tree = ast.parse(src)
        except SyntaxError as e:
            if f"def {function}" in src:
                syntax_error = e
            continue
        for node in tree.body:
            segment, line = _segment(src, node)
            module.add(node, _Statement(segment, number, line))
    if syntax_error is not None and function not in module.reads:
        raise SubmissionError("invalid_submission", f"定义 {function} 的代码单元有语法错误：第 {syntax_error.lineno} 行 "
                              f"{syntax_error.msg}")
    _check_globals(module, function)
    return module.source()


def _check_globals(module: _Module, function: str) -> None:
    """Follow the graded function through the helpers it reads: every global it needs must be
    defined by kept code (or be a builtin), else the sandbox would only say NameError."""
    if function not in module.reads:
        if function in module.dropped:
            raise SubmissionError("invalid_submission", f"函数 `{function}` 只在{module.dropped[function].where()}定义，"
                                  f"而这条语句不会运行：{KEPT_ZH}。请在代码单元的顶层用 `def {function}(...)` 定义它")
        return                             # check_source reports the missing function
    seen, todo = {function}, [function]
    while todo:
        reader = todo.pop(0)
        for name in sorted(module.reads[reader] - seen):
            seen.add(name)
            if name in module.reads:
                todo.append(name)
            elif name in module.dropped:
                raise SubmissionError("invalid_submission", _dropped_zh(reader, name, module.dropped[name]))
            elif name not in BUILTINS and not module.star:
                raise SubmissionError("invalid_submission", _undefined_zh(reader, name))


def _dropped_zh(reader: str, name: str, st: _Statement) -> str:
    return (f"`{reader}` 用到的全局变量 `{name}` 只在{st.where()}定义，而这条语句不会运行：{KEPT_ZH}。"
            f"请在函数内部创建 `{name}`，或者在代码单元顶层直接给它一个字面量值（数字、字符串、list、dict 等，不调用函数）")


def _undefined_zh(reader: str, name: str) -> str:
    return (f"函数 `{reader}` 用到了没有定义的名字 `{name}`：notebook 的代码单元里找不到它的定义。"
            "评分器在全新的进程里只运行 notebook 文件里的代码，看不到 kernel 里删掉的单元格或别处定义的变量；"
            "请检查拼写，或把它的导入、定义写进 notebook")


def parameters(signature: str) -> list[str]:
    """The parameter names of a `def ...` line (a spec's signature)."""
    src = signature.strip()
    fn = ast.parse(src + ("" if src.endswith(":") else ":") + "\n    pass\n").body[0]
    return _names(fn)


def _names(fn) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def _same_interface(fn, params: list[str]) -> bool:
    """The task's parameters first, in order; any further parameter has a default."""
    a = fn.args
    positional = a.posonlyargs + a.args
    optional = {p.arg for p in positional[len(positional) - len(a.defaults):]} if a.defaults else set()
    optional |= {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
    names = _names(fn)
    return names[:len(params)] == params and all(n in optional for n in names[len(params):])


def check_source(source: str, function: str, params: list[str] | None = None) -> None:
    """Static checks before anything runs: parses, defines the function (with the task's
    parameters, when given), imports nothing internal."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise SubmissionError("invalid_submission", f"代码有语法错误：第 {e.lineno} 行 {e.msg}") from None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if not defs:
        raise SubmissionError("invalid_submission", f"没有找到函数 `{function}`：请保留题目给出的函数名和参数")
    if params is not None and not _same_interface(defs[-1], list(params)):   # the last definition is called
        raise SubmissionError("invalid_submission", f"函数 `{function}` 的参数必须是 {', '.join(params)}"
                                                    f"（题目给出的接口；可以再加带默认值的参数），"
                                                    f"你的是 {', '.join(_names(defs[-1])) or '（无）'}")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(FORBIDDEN_MODULES):
                raise SubmissionError("forbidden", f"提交的代码导入了评分器内部模块 `{name}`：不允许读取参考答案或评分代码")


def read_submission(path: str | os.PathLike, function: str) -> str:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        from ..errors import os_error_zh
        raise SubmissionError("invalid_submission", f"无法读取提交的文件 {os_error_zh(e)}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionError("invalid_submission", "提交的文件不是 UTF-8 文本") from None
    if p.suffix == ".ipynb":
        return notebook_source(text, function)
    return text


__all__ = ["SubmissionError", "notebook_source", "check_source", "read_submission", "FORBIDDEN_MODULES"]
