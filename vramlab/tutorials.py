"""Executable tutorials: text sources in, notebooks with the outputs they really produced out.

Each chapter's tutorial is a plain-text source, `tutorials/chNN.py` (jupytext "percent" format:
`# %%` starts a code cell, `# %% [markdown]` a Chinese text cell), so it diffs and reviews like
code. `vramlab tutorials run` executes every source top to bottom in a fresh kernel and writes
`docs/chapters/chNN-tutorial.ipynb`, which the site renders with its outputs (the build itself
never executes anything). The notebook's metadata records what produced the outputs:

    "vramlab": {"source_sha256": ..., "package_sha256": ..., "torch": ..., "executed": ...}

`vramlab tutorials check` (and the test suite) fails when a committed notebook's hashes no longer
match its source or the vramlab package: outputs on the site are never stale.

A tutorial hands its results to its chapter page by name: `from vramlab.tutorials import publish`,
`publish("peak_mib", peak / MiB, fmt="{:.0f}")` (vramlab/published.py); the page writes
`[[chNN.peak_mib]]` (docs/hooks/bound_numbers.py, vramlab/bound_numbers.py). The values are outputs
of the notebook, so the same freshness check covers them.
"""
from __future__ import annotations

import datetime
import hashlib
import platform
import sys
from pathlib import Path

from .published import publish  # noqa: F401 - the tutorials' one import from this module

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "tutorials"
OUTPUTS = ROOT / "docs" / "chapters"
PACKAGE = Path(__file__).resolve().parent
TIMEOUT_S = 600


def sources() -> list[Path]:
    return sorted(SOURCES.glob("ch[0-9][0-9].py"))


def output_for(source: Path) -> Path:
    return OUTPUTS / f"{source.stem}-tutorial.ipynb"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Grading code that no tutorial imports (tests/test_tutorials.py checks that none does).
NOT_IMPORTED_BY_TUTORIALS = ("grader", "exercises", "notebooks.py",
                             "bound_numbers.py")

# What a tutorial runs when it imports this module is `publish` (vramlab/published.py): the freshness
# hash takes that file for it, not the runner below (changing how tutorials are executed changes no
# output). tests/test_tutorials.py checks that tutorials import nothing else from here.
TUTORIAL_API = {"vramlab.tutorials": "vramlab.published", "vramlab.tutorials.publish": "vramlab.published"}


def _module_file(name: str) -> Path | None:
    """vramlab.a.b -> vramlab/a/b.py or vramlab/a/b/__init__.py (None outside the package)."""
    parts = name.split(".")
    if parts[0] != "vramlab":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(text: str, module: str, is_package: bool) -> set[str]:
    """Every vramlab module named by an import anywhere in `text` (also inside functions)."""
    import ast

    from vramlab import LAZY

    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(text)):
        # `vramlab.measure(...)`: the package's lazy attributes (vramlab/__init__.py) import on first use
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "vramlab":
            if node.attr in LAZY:
                found.add(LAZY[node.attr])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)      # `from vramlab import models`
    return {n for n in found if n == "vramlab" or n.startswith("vramlab.")}


def import_closure(text: str) -> list[Path]:
    """The package's files a tutorial can run: the modules its code imports, what those import, and
    so on (imports found statically, a superset of those that run), with every package __init__
    on the way."""
    todo = {TUTORIAL_API.get(n, n) for n in _imports(text, "__main__", False)}
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):              # importing a.b.c runs a and a.b first
            todo.add(".".join(parts[:i])) if ".".join(parts[:i]) not in seen and i < len(parts) else None
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        todo |= _imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py") - set(seen)
    return sorted(set(seen.values()))


def package_sha256(text: str) -> str:
    """One hash over what a tutorial's output can depend on in the package: its import closure and
    the package's data files (what the modules read)."""
    h = hashlib.sha256()
    data = [p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
            and "__pycache__" not in p.parts
            and "evidence" not in p.relative_to(PACKAGE).parts      # graded evidence: read by the site only
            and "perf" not in p.relative_to(PACKAGE).parts          # benchmark history: read by the site only
            and "configs" not in p.relative_to(PACKAGE).parts]      # sample config.json files: read by --config / plan only
    for path in sorted(set(import_closure(text)) | set(data)):
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def execute(source: Path, out: Path | None = None) -> Path:
    """Run one tutorial source in a fresh kernel and write the notebook with its outputs."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    import torch

    out = out or output_for(source)
    text = source.read_text(encoding="utf-8")
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    nb.metadata["vramlab"] = {
        "source": source.name,
        "source_sha256": sha256_text(text),
        "package_sha256": package_sha256(text),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} CPU" if not torch.cuda.is_available() else torch.cuda.get_device_name(0),
        "executed": datetime.date.today().isoformat(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def execute_many(jobs: list[tuple[Path, Path | None]], workers: int | None = None):
    """Run several tutorials, `workers` at a time (default: one per CPU core, at most 4), each in
    its own process and kernel; yields (source, output path or the exception) as they finish."""
    import concurrent.futures as cf
    import multiprocessing
    import os

    workers = workers or max(1, min(4, os.cpu_count() or 1))
    # spawn, not fork: the parent may hold torch threads or a running event loop
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(execute, src, out): src for src, out in jobs}
        for fut in cf.as_completed(futures):
            try:
                yield futures[fut], fut.result()
            except Exception as e:  # noqa: BLE001 - reported per tutorial by the caller
                yield futures[fut], e


def stale(source: Path) -> str | None:
    """Why the committed notebook for `source` does not show this source's current outputs, or None."""
    import nbformat

    out = output_for(source)
    if not out.exists():
        return f"{out.name} 不存在：请运行 vramlab tutorials run"
    meta = nbformat.read(out, as_version=4).metadata.get("vramlab", {})
    text = source.read_text(encoding="utf-8")
    if meta.get("source_sha256") != sha256_text(text):
        return f"{source.name} 改过了，输出已过期"
    if meta.get("package_sha256") != package_sha256(text):
        return "它导入的 vramlab 代码（或包里的数据文件）改过了，输出已过期"
    return None


def main(argv=None) -> int:
    from .args import ChineseArgumentParser, positive_int

    p = ChineseArgumentParser(prog="vramlab tutorials", description="执行教程并检查输出是否过期")
    p.add_argument("action", choices=("run", "check", "list"))
    p.add_argument("--only", default=None, help="只处理这些章节，如 ch01,ch02")
    p.add_argument("--jobs", type=positive_int, default=None, help="同时执行几份教程（默认每个 CPU 核一份，最多 4）")
    p.add_argument("--stale", action="store_true", help="run 时只执行输出已过期的教程")
    args = p.parse_args(argv)
    chosen = sources()
    if args.only is not None:                # a chapter that has no tutorial is a mistake, not "nothing to do"
        wanted = [c.strip() for c in args.only.split(",") if c.strip()]
        known = [s.stem for s in chosen]
        unknown = [c for c in wanted if c not in known]
        if unknown or not wanted:
            print(f"错误：没有这些章节的教程：{', '.join(unknown) or '（空）'}；可选：{', '.join(known)}",
                  file=sys.stderr)
            return 2
        chosen = [s for s in chosen if s.stem in wanted]
    if args.action == "list":
        for s in chosen:
            print(s.relative_to(ROOT), "->", output_for(s).relative_to(ROOT))
        return 0
    if args.action == "run":
        if args.stale:
            chosen = [s for s in chosen if stale(s)]
            print(f"需要重新执行的教程：{len(chosen)} 份", flush=True)
        t0, failed = datetime.datetime.now(), []
        for s, out in execute_many([(s, None) for s in chosen], workers=args.jobs):
            seconds = (datetime.datetime.now() - t0).total_seconds()
            if isinstance(out, Exception):
                failed.append(s.stem)
                print(f"{s.stem}: 执行失败（{type(out).__name__}: {str(out)[:2000]}）", file=sys.stderr, flush=True)
            else:
                print(f"{s.stem}: 已执行（开始后 {seconds:.0f} s）", flush=True)
        return 1 if failed else 0
    problems = [(s, why) for s in chosen if (why := stale(s))]
    for s, why in problems:
        print(f"{s.stem}: {why}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
