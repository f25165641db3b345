"""MkDocs hook: `<!-- vramlab:calculator ... -->` becomes a VRAM calculator on the page.

    <!-- vramlab:calculator model=gpt2-small batch=8 seq=512 -->        compact widget (chapters)
    <!-- vramlab:calculator full -->                                   the full page (tools/calculator.md)

key=value pairs are `vramlab.workload.Workload` fields (plus `qlora=true`); they are checked with
`Workload.validate()` at build time, so a typo fails `mkdocs build --strict` instead of showing a
broken widget. The widget itself is plain JS (docs/assets/calculator/), loaded on every page via
extra_javascript; it ports `vramlab.estimate` and takes its data from `python -m vramlab.webdata`.
"""
from __future__ import annotations

import html
import posixpath
import re
from dataclasses import fields

from mkdocs.exceptions import PluginError

_MARKER = re.compile(r"<!--\s*vramlab:calculator\b([^>]*?)-->")
_TOOL_PAGE = "tools/calculator.md"


def _settings(args: str, where: str) -> tuple[dict[str, str], bool]:
    from vramlab.workload import Workload, WorkloadError

    words = args.split()
    full = "full" in words
    pairs = dict(w.split("=", 1) for w in words if "=" in w)
    pairs.setdefault("model", pairs.pop("preset", "gpt2-small"))
    names = {f.name: f for f in fields(Workload)}
    unknown = set(pairs) - set(names) - {"qlora"}
    if unknown or any(w != "full" and "=" not in w for w in words):
        raise PluginError(f"{where}: vramlab:calculator 标记里有未知参数：{args.strip()}")
    typed = {}
    for k, v in pairs.items():
        if k == "qlora":
            continue
        kind = type(names[k].default)
        typed[k] = (v == "true") if kind is bool else kind(v)
    try:
        Workload(**typed).validate()
    except (WorkloadError, ValueError) as e:
        raise PluginError(f"{where}: vramlab:calculator 标记的设置无效：{e}") from None
    return pairs, full


def calculator_html(args: str, page_src: str) -> str:
    pairs, full = _settings(args, page_src)
    attrs = " ".join(f'data-w-{k.replace("_", "-")}="{html.escape(v)}"' for k, v in pairs.items())
    compact = "" if full else " data-compact"
    link = ""
    if not full:
        rel = posixpath.relpath(_TOOL_PAGE, posixpath.dirname(page_src) or ".")
        link = f'\n\n[在完整的显存计算器里继续调整 →]({rel}){{ .vramlab-calc__link }}\n'
    return (f'<div class="vramlab-calc"{compact} {attrs} markdown="0">'
            '<p class="vramlab-calc__noscript">显存计算器需要启用 JavaScript。</p></div>' + link)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return _MARKER.sub(lambda m: calculator_html(m.group(1), page.file.src_uri), markdown)
