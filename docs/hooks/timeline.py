"""MkDocs hook: the memory-timeline viewer and its traces.

`<!-- vramlab:timeline -->` becomes the viewer (docs/assets/timeline/viewer.js), offering the traces
listed in docs/assets/traces/index.json (written by `python -m vramlab.trace`).

Browsers refuse `fetch()` from file://, and the offline build must work from there, so for every
docs/assets/traces/<name>.json the site also gets assets/traces/<name>.js, which hands the same
JSON to the viewer through a <script> tag. The .js files are generated here, not committed.
"""
from __future__ import annotations

import html
import json
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

_MARKER = re.compile(r"<!--\s*vramlab:timeline\s*-->")
_DIR = "assets/traces/"


def on_files(files, config):
    for f in list(files):
        uri = f.src_uri
        if uri.startswith(_DIR) and uri.endswith(".json") and uri != _DIR + "index.json":
            name = uri[len(_DIR):-len(".json")]
            with open(f.abs_src_path, encoding="utf-8") as fh:
                body = fh.read().strip()
            content = f"window.vramlabTraceLoaded({json.dumps(name)}, {body});\n"
            files.append(File.generated(config, f"{_DIR}{name}.js", content=content))
    return files


def _index(config) -> list[dict]:
    path = f"{config['docs_dir']}/{_DIR}index.json"
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise PluginError(f"{path} 不存在：请运行 python -m vramlab.trace") from None


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not _MARKER.search(markdown):
        return markdown
    traces = html.escape(json.dumps(_index(config), ensure_ascii=False), quote=True)
    block = (f'<div class="vramlab-timeline" data-traces="{traces}" markdown="0">'
             '<p class="vramlab-timeline__noscript">时间线查看器需要启用 JavaScript。</p></div>')
    return _MARKER.sub(lambda m: block, markdown)
