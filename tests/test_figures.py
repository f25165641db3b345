"""Every chapter page shows figures: a diagram drawn by code and a plot its tutorial measured.

- Diagrams: scripts/diagrams/chNN.py draws docs/assets/figures/*.svg (scripts/draw_diagrams.py); a
  chapter embeds one as `![alt](../assets/figures/NAME.svg){ .vl-diagram }`.
- Plots: `<!-- vramlab:tutorial-figure index=N alt="…" caption="…" -->` (docs/hooks/tutorial_figures.py)
  shows the N-th image output of the chapter's committed tutorial notebook, copied, never redrawn;
  `vramlab tutorials check` keeps that notebook fresh, so the plot is fresh too.

The fast tests read the Markdown and run the hook's own extraction (no process, no build); the slow
one reads the shared site builds (tests/site_build.py) to check what a reader actually gets.
"""
from __future__ import annotations

import base64
import html
import importlib.util
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest
from mkdocs.exceptions import PluginError

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CHAPTERS = [f"ch{n:02d}" for n in range(1, 31)]
# alt text may hold bound numbers, [[chNN.name]] (docs/hooks/bound_numbers.py)
DIAGRAM = re.compile(r"!\[((?:\[\[[^\]]*\]\]|[^\]])*)\]\(([^)\s]+\.svg)\)\{[^}]*\.vl-diagram\b[^}]*\}")
PNG = b"\x89PNG\r\n\x1a\n"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hook = _load("vramlab_hook_tutorial_figures", DOCS / "hooks" / "tutorial_figures.py")


def test_diagrams_match_the_code_that_draws_them(capsys):
    draw = _load("vramlab_draw_diagrams", REPO / "scripts" / "draw_diagrams.py")
    assert draw.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_shows_a_diagram_and_a_plot_from_its_tutorial(chapter):
    page = f"chapters/{chapter}.md"
    text = (DOCS / page).read_text(encoding="utf-8")
    problems = []
    diagrams = DIAGRAM.findall(text)
    for alt, src in diagrams:
        if not alt.strip():
            problems.append(f"示意图 {src} 没有替代文字")
        if not (DOCS / "chapters" / src).resolve().is_file():
            problems.append(f"示意图 {src} 不存在")
    plots = hook.figures_in(text, page, str(DOCS))         # raises on a missing notebook or image
    for fig in plots:
        if not (fig.data.startswith(PNG) or fig.data.lstrip().startswith(b"<")):
            problems.append(f"{fig.src_uri} 不是 PNG 或 SVG")
    own = [f for f in plots if f.chapter == chapter and not f.computed]
    if not diagrams:
        problems.append("没有 { .vl-diagram } 示意图")
    if not own:
        problems.append(f"没有来自本章教程（{chapter}-tutorial.ipynb）的实测图：vramlab:tutorial-figure，不带 computed")
    assert len(diagrams) + len(plots) >= 2 and not problems, f"{chapter}：" + "；".join(problems)


def _notebook(path: Path, n_images: int, banner: str = "后端         CPU 上的模拟设备（vramlab SimDevice）\n"):
    png = base64.b64encode(PNG + b"fake").decode()
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "banner()",
              "outputs": [{"output_type": "stream", "name": "stdout", "text": banner}]}]
    cells += [{"cell_type": "code", "metadata": {}, "execution_count": i + 2, "source": "plt.show()",
               "outputs": [{"output_type": "display_data", "metadata": {}, "data": {"image/png": png}}]}
              for i in range(n_images)]
    meta = {"vramlab": {"torch": "2.13.0+cpu", "executed": "2026-11-30"}}
    path.write_text(json.dumps({"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}),
                    encoding="utf-8")


def _build_files(docs: Path, site: Path, pages: dict[str, str]):
    """Run the hook's on_files over a docs dir holding `pages`, as `mkdocs build` would."""
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import File, Files

    for uri, text in pages.items():
        (docs / uri).parent.mkdir(parents=True, exist_ok=True)
        (docs / uri).write_text(text, encoding="utf-8")
    config = MkDocsConfig()
    config.load_dict({"site_name": "t", "docs_dir": str(docs), "site_dir": str(site)})
    errors, warnings = config.validate()
    assert not errors, errors
    config.plugins._current_plugin = "tutorial_figures"     # set by mkdocs while it runs a hook's event
    files = Files([File(uri, str(docs), str(site), use_directory_urls=True) for uri in pages])
    return hook.on_files(files, config), config


def test_marker_copies_the_notebook_image_and_says_where_it_was_measured(tmp_path):
    docs = tmp_path / "docs"
    (docs / "chapters").mkdir(parents=True)
    _notebook(docs / "chapters" / "ch99-tutorial.ipynb", 2)
    files, _ = _build_files(docs, tmp_path / "site", {
        "chapters/ch99.md": '正文\n\n<!-- vramlab:tutorial-figure index=2 alt="一张图" caption="测了什么" -->\n'})
    made = files.get_file_from_path("assets/tutorial-figures/ch99-2.png")
    assert made is not None and made.content_bytes.startswith(PNG)
    fig = hook.figures_in((docs / "chapters/ch99.md").read_text(encoding="utf-8"), "chapters/ch99.md", str(docs))[0]
    out = hook.figure_markdown(fig, "chapters/ch99.md")
    assert "![一张图](../assets/tutorial-figures/ch99-2.png)" in out
    assert "(ch99-tutorial.ipynb)" in out
    assert "CPU 上的模拟设备（vramlab SimDevice）" in out and "2.13.0+cpu" in out and "2026-11-30" in out


@pytest.mark.parametrize("marker, nb_images, message", [
    ('index=3 alt="图" caption="说明"', 2, "只有 2 张图"),                 # past the last image
    ('index=1 alt="图" caption="说明"', 0, "只有 0 张图"),                 # a tutorial without plots
    ('ch=ch98 index=1 alt="图" caption="说明"', 1, "ch98-tutorial.ipynb 不存在"),   # no such notebook
    ('index=1 caption="说明"', 1, "缺少非空的 alt"),
    ('index=1 alt="图" caption="说明" colour=red', 1, "未知参数"),
])
def test_marker_pointing_to_a_missing_image_fails_the_build(tmp_path, marker, nb_images, message):
    docs = tmp_path / "docs"
    (docs / "chapters").mkdir(parents=True)
    _notebook(docs / "chapters" / "ch99-tutorial.ipynb", nb_images)
    with pytest.raises(PluginError, match=message) as err:
        _build_files(docs, tmp_path / "site", {"chapters/ch99.md": f"正文\n\n<!-- vramlab:tutorial-figure {marker} -->\n"})
    assert "chapters/ch99.md" in str(err.value)          # the message names the page


def test_marker_split_over_lines_fails_and_one_in_a_code_block_is_left_alone(tmp_path):
    docs = tmp_path / "docs"
    (docs / "chapters").mkdir(parents=True)
    _notebook(docs / "chapters" / "ch99-tutorial.ipynb", 1)
    shown = '```markdown\n<!-- vramlab:tutorial-figure index=7 alt="图" caption="说明" -->\n```\n'
    files, _ = _build_files(docs, tmp_path / "site", {"chapters/ch99.md": shown})
    assert not [f for f in files if f.src_uri.startswith(hook.OUT_DIR)]
    with pytest.raises(PluginError, match="同一行"):
        _build_files(docs, tmp_path / "site2", {
            "chapters/ch99.md": '<!-- vramlab:tutorial-figure index=1 alt="图"\n  caption="说明" -->\n'})


def test_notebook_without_a_backend_line_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    (docs / "chapters").mkdir(parents=True)
    _notebook(docs / "chapters" / "ch99-tutorial.ipynb", 1, banner="Python 3.11\n")
    with pytest.raises(PluginError, match="后端"):
        _build_files(docs, tmp_path / "site", {"chapters/ch99.md": '<!-- vramlab:tutorial-figure index=1 alt="图" caption="说明" -->\n'})


_IMG = re.compile(r"<img\b[^>]*>")
_FIGURE = re.compile(r'<figure class="vl-plot">(.*?)</figure>', re.S)


def _attr(tag: str, name: str) -> str | None:
    m = re.search(rf'\b{name}="([^"]*)"', tag)
    return html.unescape(m.group(1)) if m else None


@pytest.mark.slow          # reads the shared site builds (mkdocs runs in a process)
@pytest.mark.parametrize("offline", [False, True], ids=["site", "offline"])
def test_built_chapters_show_their_figures(offline):
    from site_build import shared_build

    site = shared_build(offline=offline)
    problems = []
    for chapter in CHAPTERS:
        page = site / "chapters" / (f"{chapter}.html" if offline else f"{chapter}/index.html")
        text = page.read_text(encoding="utf-8")
        diagrams = [t for t in _IMG.findall(text) if "vl-diagram" in (_attr(t, "class") or "")]
        plots = [(_IMG.search(body), body) for body in _FIGURE.findall(text)]
        for tag in diagrams + [img.group() for img, _ in plots if img]:
            src = _attr(tag, "src") or ""
            if not (_attr(tag, "alt") or "").strip():
                problems.append(f"{chapter}: {src} 没有替代文字")
            if not (page.parent / unquote(src)).resolve().is_file():
                problems.append(f"{chapter}: {src} 在站点里不存在")
        for img, body in plots:
            link = re.search(r'href="([^"]*tutorial[^"]*)"', body)
            target = urljoin(page.as_uri(), link.group(1)) if link else ""
            if img is None or "<figcaption>" not in body or not link:
                problems.append(f"{chapter}: vl-plot 缺少图、图注或教程链接")
            elif not Path(unquote(target[len("file://"):])).is_file() and not Path(
                    unquote(target[len("file://"):]), "index.html").is_file():
                problems.append(f"{chapter}: 教程链接 {link.group(1)} 指向不存在的页面")
        if not diagrams:
            problems.append(f"{chapter}: 没有 vl-diagram 示意图")
        if not plots:
            problems.append(f"{chapter}: 没有 vl-plot 实测图")
    assert not problems, "\n".join(problems)
