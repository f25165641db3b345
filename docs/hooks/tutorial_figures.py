"""MkDocs hook: a chapter page shows a plot its tutorial measured, taken from the committed notebook.

    <!-- vramlab:tutorial-figure index=1 alt="……" caption="……" -->
    <!-- vramlab:tutorial-figure ch=ch16 index=1 computed alt="……" caption="……" -->

`index` is the n-th image output (1-based, in cell order) of docs/chapters/<ch>-tutorial.ipynb;
`ch` defaults to the page's own chapter (chapters/chNN.md -> chNN). `alt` (what the image shows) and
`caption` (what was measured) are Chinese text; the caption may use inline Markdown. `computed`
marks a plot drawn from arithmetic, not from a measurement.

The image is never redrawn: on_files copies the bytes of that output (image/svg+xml if the cell has
it, else image/png) to the site as assets/tutorial-figures/<ch>-<index>.<ext>, so it is always the
plot the tutorial produced, and `vramlab tutorials check` (the notebook is not stale) covers it. The
caption's provenance — backend, PyTorch version, date — is read from the same notebook: the backend
from the line the tutorial's first cell prints (`后端 …`), the rest from the notebook's "vramlab"
metadata (vramlab/tutorials.py). The figure links to the tutorial page.

A marker takes a line of its own; inside fenced code it is shown, not replaced. A missing notebook,
an index past the notebook's last image, a missing alt/caption, an unknown parameter or a marker not
closed on its line fails the build with a message that names the page (tests/test_figures.py).
"""
from __future__ import annotations

import base64
import json
import os
import posixpath
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

MARKER = re.compile(r"[ \t]*<!--\s*vramlab:tutorial-figure\b(.*?)-->[ \t]*$", re.M)
_ARG = re.compile(r'\s*([a-z]+)(?:=(?:"([^"]*)"|(\S+)))?')
_CHAPTER_PAGE = re.compile(r"(?:^|/)(ch\d\d)\.md$")
OUT_DIR = "assets/tutorial-figures/"
NOTEBOOK_DIR = "chapters/"
_KEYS = {"ch", "index", "alt", "caption", "computed"}

_cache: dict[str, tuple[int, dict]] = {}          # notebook path -> (mtime_ns, parsed)


class Figure:
    """One marker, resolved: where its image comes from and how the page shows it."""

    def __init__(self, chapter: str, index: int, alt: str, caption: str, computed: bool):
        self.chapter, self.index, self.alt, self.caption, self.computed = chapter, index, alt, caption, computed
        self.ext = ""
        self.data = b""
        self.meta: dict[str, str] = {}

    @property
    def src_uri(self) -> str:
        return f"{OUT_DIR}{self.chapter}-{self.index}.{self.ext}"

    @property
    def notebook_uri(self) -> str:
        return f"{NOTEBOOK_DIR}{self.chapter}-tutorial.ipynb"


def parse_marker(args: str, page_src: str) -> Figure:
    pairs: dict[str, str | None] = {}
    pos = 0
    args = args.strip()
    while pos < len(args):
        m = _ARG.match(args, pos)
        if not m or m.end() == pos:
            raise PluginError(f"{page_src}: 无法解析 vramlab:tutorial-figure 标记：{args}")
        pairs[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
        pos = m.end()
    unknown = set(pairs) - _KEYS
    if unknown:
        raise PluginError(f"{page_src}: vramlab:tutorial-figure 标记里有未知参数 {sorted(unknown)}：{args}")
    chapter = pairs.get("ch")
    if not chapter:
        own = _CHAPTER_PAGE.search(page_src)
        if not own:
            raise PluginError(f"{page_src}: 不是章节页，vramlab:tutorial-figure 标记要写 ch=chNN")
        chapter = own.group(1)
    if not re.fullmatch(r"ch\d\d", chapter):
        raise PluginError(f"{page_src}: vramlab:tutorial-figure 的 ch 应为 chNN，而不是 {chapter!r}")
    if not (pairs.get("index") or "").isdigit() or int(pairs["index"]) < 1:
        raise PluginError(f"{page_src}: vramlab:tutorial-figure 要有 index=N（从 1 数起的第 N 张图）：{args}")
    for key in ("alt", "caption"):
        if not (pairs.get(key) or "").strip():
            raise PluginError(f"{page_src}: vramlab:tutorial-figure 缺少非空的 {key}=\"…\"：{args}")
    if "computed" in pairs and pairs["computed"] is not None:
        raise PluginError(f"{page_src}: computed 是开关，不带值：{args}")
    return Figure(chapter, int(pairs["index"]), pairs["alt"].strip(), pairs["caption"].strip(), "computed" in pairs)


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _notebook(path: str) -> dict:
    """The parsed notebook, parsed once per change."""
    mtime = os.stat(path).st_mtime_ns
    hit = _cache.get(path)
    if hit and hit[0] == mtime:
        return hit[1]
    with open(path, encoding="utf-8") as fh:
        nb = json.load(fh)
    _cache[path] = (mtime, nb)
    return nb


def images(nb: dict) -> list[tuple[str, bytes]]:
    """Every image output of the notebook, in cell order: (extension, bytes)."""
    found = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/svg+xml" in data:
                found.append(("svg", _text(data["image/svg+xml"]).encode("utf-8")))
            elif "image/png" in data:
                found.append(("png", base64.b64decode(_text(data["image/png"]))))
    return found


def backend(nb: dict) -> str | None:
    """What the tutorial ran on, as its first code cell printed it (`后端 …` / `显存后端：…`), without
    the package versions that some tutorials append after a top-level `，`."""
    first = next((c for c in nb.get("cells", []) if c.get("cell_type") == "code"), None)
    for out in (first or {}).get("outputs", []):
        for line in _text(out.get("text", "")).splitlines():
            m = re.match(r"\s*(?:显存)?后端\s*[:：]?\s*(\S.*)$", line)
            if m:
                text, depth = m.group(1).strip(), 0
                for i, ch in enumerate(text):
                    depth += 1 if ch in "（(" else -1 if ch in "）)" else 0
                    if ch == "，" and depth == 0:
                        return text[:i]
                return text
    return None


def resolve(fig: Figure, docs_dir: str, page_src: str) -> Figure:
    """Fill in the image and the provenance from the committed notebook; fail loudly if absent."""
    path = os.path.join(docs_dir, fig.notebook_uri)
    if not os.path.isfile(path):
        raise PluginError(f"{page_src}: vramlab:tutorial-figure 指向的教程 docs/{fig.notebook_uri} 不存在"
                          f"（先运行 vramlab tutorials run --only {fig.chapter}）")
    nb = _notebook(path)
    found = images(nb)
    if fig.index > len(found):
        raise PluginError(f"{page_src}: vramlab:tutorial-figure index={fig.index} 指向的图不存在："
                          f"docs/{fig.notebook_uri} 只有 {len(found)} 张图")
    fig.ext, fig.data = found[fig.index - 1]
    meta = nb.get("metadata", {}).get("vramlab", {})
    where = backend(nb)
    missing = [k for k in ("torch", "executed") if not meta.get(k)] + ([] if where else ["后端"])
    if missing:
        raise PluginError(f"{page_src}: docs/{fig.notebook_uri} 缺少测量环境信息 {missing}"
                          "（第一个代码单元应打印“后端”，元数据由 vramlab tutorials run 写入）")
    fig.meta = {"backend": where, "torch": meta["torch"], "date": meta["executed"]}
    return fig


def markers(markdown: str, page_src: str) -> list[re.Match]:
    """The markers of a page, each on a line of its own, outside fenced code (where a page may show
    the syntax). A marker line that does not close on the same line fails instead of vanishing."""
    found, fence = [], None
    for line in re.finditer(r"^.*$", markdown, re.M):
        text = line.group()
        opened = re.match(r"\s*(```+|~~~+)", text)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        m = MARKER.match(markdown, line.start(), line.end())
        if m:
            found.append(m)
        elif re.match(r"\s*<!--\s*vramlab:tutorial-figure\b", text):
            raise PluginError(f"{page_src}: vramlab:tutorial-figure 标记要在同一行里写完（以 --> 结尾）：{text[:80]}")
    return found


def figures_in(markdown: str, page_src: str, docs_dir: str) -> list[Figure]:
    return [resolve(parse_marker(m.group(1), page_src), docs_dir, page_src) for m in markers(markdown, page_src)]


def figure_markdown(fig: Figure, page_src: str) -> str:
    """The <figure> for one marker; paths are relative to the page, so MkDocs checks and rewrites them
    (directory URLs online, .html files offline) like any other link."""
    here = posixpath.dirname(page_src) or "."
    img = posixpath.relpath(fig.src_uri, here)
    tutorial = posixpath.relpath(fig.notebook_uri, here)
    alt = fig.alt.replace("[", "［").replace("]", "］")
    number = int(fig.chapter[2:])
    caption = fig.caption.rstrip("。")
    m = fig.meta
    if fig.computed:
        source = (f"按公式计算，不是测量；图由[第 {number} 章动手教程]({tutorial})绘制"
                  f"（PyTorch {m['torch']}，{m['date']} 执行）")
    else:
        source = (f"图和数据出自[第 {number} 章动手教程]({tutorial})，运行环境：{m['backend']}，"
                  f"PyTorch {m['torch']}，{m['date']}")
    return (f'<figure class="vl-plot" markdown="span">\n'
            f"![{alt}]({img})\n"
            f'<figcaption markdown="span">{caption}。{source}。</figcaption>\n'
            f"</figure>")


def on_files(files, config):
    """Copy every image a page's marker refers to out of its notebook into the site."""
    wanted: dict[str, Figure] = {}
    for f in files.documentation_pages():
        if not f.src_uri.endswith(".md") or f.abs_src_path is None:
            continue
        with open(f.abs_src_path, encoding="utf-8") as fh:
            text = fh.read()
        if "vramlab:tutorial-figure" not in text:
            continue
        for fig in figures_in(text, f.src_uri, config["docs_dir"]):
            wanted.setdefault(fig.src_uri, fig)
    for uri, fig in wanted.items():
        files.append(File.generated(config, uri, content=fig.data))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "vramlab:tutorial-figure" not in markdown:
        return markdown
    src = page.file.src_uri
    out, last = [], 0
    for m in markers(markdown, src):
        fig = resolve(parse_marker(m.group(1), src), config["docs_dir"], src)
        out += [markdown[last:m.start()], figure_markdown(fig, src)]
        last = m.end()
    return "".join(out) + markdown[last:]
