"""MkDocs hook: the performance page's tables, rendered from vramlab/data/perf/history.jsonl.

A line `<!-- perf-history BENCHMARK -->` in a page becomes a table of every recorded measurement
of that benchmark, newest first: date, commit, what it ran on, the figures, the command."""
from __future__ import annotations

import json
import re
from pathlib import Path

HISTORY = Path(__file__).resolve().parents[2] / "vramlab" / "data" / "perf" / "history.jsonl"
MARK = re.compile(r"^<!-- perf-history ([\w.-]+) -->$", re.M)


def _entries() -> list[dict]:
    if not HISTORY.exists():
        return []
    return [json.loads(line) for line in HISTORY.read_text(encoding="utf-8").splitlines() if line.strip()]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def table(benchmark: str, entries: list[dict]) -> str:
    rows = [e for e in entries if e.get("benchmark") == benchmark]
    if not rows:
        raise ValueError(f"performance page: no recorded measurement of {benchmark!r} in {HISTORY}")
    keys = list(dict.fromkeys(k for e in rows for k in e["figures"]))
    head = "| 日期 | 提交 | 机器 | " + " | ".join(keys) + " | 命令 | 说明 |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for e in sorted(rows, key=lambda e: e["date"], reverse=True):
        on = e.get("on") or {}
        where = f"{on.get('cores', '?')} 核 {on.get('machine', '')}，torch {on.get('torch') or '?'}"
        if on.get("load_average"):
            where += f"，负载 {on['load_average'][0]}"
        figures = " | ".join(_cell(e["figures"].get(k, "")) for k in keys)
        lines.append(f"| {e['date']} | {e.get('commit') or '-'} | {where} | {figures} | `{e['command']}` | "
                     f"{(e.get('note') or '').replace('|', '/')} |")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if "perf-history" not in markdown:
        return markdown
    entries = _entries()
    return MARK.sub(lambda m: table(m.group(1), entries), markdown)
