"""MkDocs hook: notebook pages that are cheap to build.

One stylesheet for every tutorial notebook page instead of a copy in each:

nbconvert's "lab" template inlines the whole JupyterLab stylesheet (~590 KB) into every rendered
notebook. With 30 tutorials that is 18 MB of identical CSS, which the search plugin also parses
page by page (most of the build's time). The <style> blocks of a notebook page are replaced by a
<link> to assets/stylesheets/notebook.css, written once after the build; a page whose styles
differ from the first page's keeps its own (nothing is ever styled wrongly).

The search plugin then indexes a notebook page's text and code without the cells' outputs and the
syntax-highlighting <span>s (one per token, most of the page's tags): the words worth searching
for, a fraction of the parsing. The page
itself keeps them: the light copy is swapped in just before the search plugin reads the page and
swapped back right after.
"""
from __future__ import annotations

import os
import re

from mkdocs.plugins import CombinedEvent, event_priority
from mkdocs.utils import get_relative_url

_STYLE = re.compile(r"<style[^>]*>.*?</style>", re.S)
# nbconvert's template adds, to a notebook with ipywidgets state (tqdm progress bars, say), a script
# that loads the widget renderer from unpkg.com: the site makes no request to another host, so it
# goes (the widgets' saved views stay in the page, unrendered, as they would be offline anyway).
_WIDGETS_LOADER = re.compile(r"<script>\s*\(function\(\) \{\s*function addWidgetsRenderer\(\).*?</script>", re.S)
_SPAN = re.compile(r"</?span\b[^>]*>")
_OUTPUTS = '<div class="jp-Cell-outputWrapper">'
_DIV = re.compile(r"<div\b|</div>")


def _without_outputs(html: str) -> str:
    """The page without its cells' outputs (printed numbers and tables: nothing to search for)."""
    parts, start = [], 0
    while (begin := html.find(_OUTPUTS, start)) != -1:
        depth, end = 0, len(html)
        for m in _DIV.finditer(html, begin):
            depth += 1 if m.group() == "<div" else -1
            if depth == 0:
                end = m.end()
                break
        parts.append(html[start:begin])
        start = end
    parts.append(html[start:])
    return "".join(parts)
ASSET = "assets/stylesheets/notebook.css"
_css: str | None = None

# Appended to the notebook stylesheet: tutorials readable on a phone. nbconvert's layout keeps a
# 64 px "In [ ]:" column and the same for outputs, plus 10 px of padding around the notebook and
# 5 px around each cell; on a 390 px screen that leaves code half the width. The notebook is also
# `overflow: auto`, which makes it a block formatting context that shrinks beside the floated
# download button for its whole length (and so is each cell's flex row). On narrow screens: no
# prompts, no padding, no shrinking; code and outputs scroll inside their own box, images scale down.
MOBILE_CSS = """
/* vramlab (docs/hooks/notebook_css.py): notebooks on phones */
.jupyter-wrapper .jp-OutputArea-output { max-width: 100%; overflow-x: auto; }
.jupyter-wrapper .jp-RenderedImage img, .jupyter-wrapper .jp-RenderedSVG svg { max-width: 100%; height: auto; }
@media screen and (max-width: 44.9375em) {
  .jupyter-wrapper .jp-Notebook { padding: 0; overflow: visible; }
  .jupyter-wrapper .jp-Cell { padding: 0.2rem 0; }
  .jupyter-wrapper .jp-CodeCell .jp-Cell-inputWrapper .jp-InputPrompt,
  .jupyter-wrapper .jp-InputPrompt, .jupyter-wrapper .jp-OutputPrompt,
  .jupyter-wrapper .jp-OutputArea-prompt { display: none; }
  .jupyter-wrapper .jp-OutputArea-output { padding-left: 0; }
  /* without prompts the flex rows hold one box each; as flex boxes the first cell would also
     shrink beside the floated download button */
  .jupyter-wrapper .jp-Cell-inputWrapper, .jupyter-wrapper .jp-InputArea,
  .jupyter-wrapper .jp-OutputArea-child { display: block; }
  .jupyter-wrapper .jp-InputArea-editor { width: auto; min-width: 0; }
}
"""


def on_page_content(html: str, page, config, files) -> str:
    global _css
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = _WIDGETS_LOADER.sub("", html)
    blocks = _STYLE.findall(html)
    if not blocks:
        return html
    css = "\n".join(re.sub(r"^<style[^>]*>|</style>$", "", b) for b in blocks)
    if _css is None:
        _css = css
    elif css != _css:
        return html + f"<style>{MOBILE_CSS}</style>"      # its own styles, and the phone rules
    link = f'<link rel="stylesheet" href="{get_relative_url(ASSET, page.url)}">'
    return link + _STYLE.sub("", html)


@event_priority(100)            # before the search plugin (priority 0)
def _light_for_search(context, page, config, nav):
    if page.file.src_uri.endswith(".ipynb") and page.content:
        page._full_content = page.content
        page.content = _SPAN.sub("", _without_outputs(page.content))
    return context


@event_priority(-100)           # after it: the page is rendered with everything
def _full_for_page(context, page, config, nav):
    full = getattr(page, "_full_content", None)
    if full is not None:
        page.content = full
        del page._full_content
    return context


on_page_context = CombinedEvent(_light_for_search, _full_for_page)


def on_post_build(config) -> None:
    if _css is None:
        return
    path = os.path.join(config["site_dir"], ASSET)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_css + MOBILE_CSS)


def on_startup(command, dirty) -> None:       # `mkdocs serve` rebuilds in the same process
    global _css
    _css = None
