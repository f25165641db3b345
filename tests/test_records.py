"""Every key the grader spells on a result or a payload is declared in vramlab/grader/records.py:
a misspelt key (`result["peek_bytes"]`) fails here instead of reading None in a report."""
from __future__ import annotations

import ast
from pathlib import Path

from vramlab.grader.records import Payload, Result

GRADER = Path(__file__).resolve().parent.parent / "vramlab" / "grader"
# the names the grader gives these records; bench.py's `result` and `r` are its own summaries
NAMES = {"result": Result, "case": Result, "payload": Payload, "bp": Payload, "sp": Payload,
         "h.payload": Payload, "self.payload": Payload}
PER_FILE = {"report.py": {"r": Result}, "sandbox.py": {"p": Payload, "merged": Payload}}
SKIP = {"bench.py"}


def keys_used(source: str, names: dict) -> list[tuple[int, str, type]]:
    """(line, key, record) for `x["key"]`, `x.get("key")`, `x.setdefault("key")`, `x.pop("key")`
    and `x.update(key=...)` where x is one of `names`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target, keys = None, []
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            target, keys = node.value, [node.slice.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "setdefault", "pop") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                target, keys = node.func.value, [node.args[0].value]
            elif node.func.attr == "update":
                target, keys = node.func.value, [k.arg for k in node.keywords if k.arg]
        record = names.get(ast.unparse(target)) if target is not None else None
        found += [(node.lineno, k, record) for k in keys if record is not None]
    return found


def undeclared(path: Path, source: str) -> list[str]:
    names = dict(NAMES, **PER_FILE.get(path.name, {}))
    return [f"{path.relative_to(GRADER)}:{line}: {record.__name__}[{key!r}]"
            for line, key, record in keys_used(source, names) if key not in record.__annotations__]


def test_every_key_the_grader_uses_is_declared():
    files = [p for p in sorted(GRADER.rglob("*.py")) if p.name not in SKIP]
    used = [k for p in files for k in keys_used(p.read_text(encoding="utf-8"), dict(NAMES, **PER_FILE.get(p.name, {})))]
    assert len(used) > 200            # the scan sees the records (a renamed variable would hide them)
    bad = [line for p in files for line in undeclared(p, p.read_text(encoding="utf-8"))]
    assert not bad, "undeclared keys (add them to vramlab/grader/records.py, or fix the spelling):\n" + "\n".join(bad)


def test_a_misspelt_key_fails():
    source = 'def judge(spec, result, bp, sp):\n    result.update(peek_bytes=sp["peak_bytes"])\n    return bp.get("los")\n'
    bad = undeclared(GRADER / "kinds" / "x.py", source)
    assert bad == ["kinds/x.py:2: Result['peek_bytes']", "kinds/x.py:3: Payload['los']"], bad


def test_base_result_has_only_declared_keys():
    import types

    spec = types.SimpleNamespace(id="x", kind="train_step", points=10, target_ratio=0.5, max_time_ratio=None, hints=())
    from vramlab.grader.core import base_result

    assert set(base_result(spec, "sim", "ci")) <= set(Result.__annotations__)
