"""Static checks of the course website (MkDocs + Material), no browser and no network needed.

Builds the site twice into a temporary directory (online build and the OFFLINE=true build that
works from file://), then checks chapter pages and titles, that no page loads anything from
another host, that every relative link resolves, and that a tutorial notebook renders without
its CDN scripts. Run from anywhere: the builds run in the repository root, which MkDocs needs
for the jieba user dictionary path.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from site_build import BUILD_TIMEOUT_S, shared_build

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

pytest.importorskip("mkdocs", reason="网站依赖未安装: pip install -e '.[site]'")
pytest.importorskip("material", reason="网站依赖未安装: pip install -e '.[site]'")

REPO = Path(__file__).resolve().parents[1]

# The 30 chapter titles of the course outline (seed 000); page h1 is "第 N 章 <title>".
CHAPTERS = {
    1: "显存基础认知", 2: "显存监控工具", 3: "模型加载优化", 4: "数据加载管线", 5: "梯度累积技术",
    6: "混合精度训练（AMP）", 7: "激活检查点", 8: "梯度压缩与通信优化", 9: "模型并行策略",
    10: "数据并行优化", 11: "显存碎片化处理", 12: "动态显存管理", 13: "Batch Size 调优",
    14: "序列长度优化", 15: "嵌入层优化", 16: "注意力机制优化", 17: "前馈网络优化",
    18: "Layer Normalization 优化", 19: "优化器显存优化", 20: "分布式训练显存",
    21: "显存溢出（OOM）排查", 22: "模型量化技术", 23: "知识蒸馏与显存", 24: "LoRA 微调显存优化",
    25: "AdaLoRA 与 DoRA", 26: "Prefix Tuning 与 Prompt Tuning", 27: "P-Tuning v2",
    28: "模型卸载（Offloading）", 29: "显存调优工具链", 30: "综合调优案例",
}
STAGES = {"基础篇": range(1, 6), "进阶篇": range(6, 16), "高级篇": range(16, 26), "实战篇": range(26, 31)}

@pytest.fixture(scope="module")
def site() -> Path:
    return shared_build(offline=False)


@pytest.fixture(scope="module")
def offline_site() -> Path:
    return shared_build(offline=True)


# --------------------------------------------------------------------------- HTML helpers

class _Refs(HTMLParser):
    """Collects (tag, attribute, value) for every URL-bearing attribute, plus inline CSS."""

    URL_ATTRS = {"href", "src", "data", "poster", "action", "formaction", "srcset"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str, str]] = []
        self.css: list[str] = []
        self.h1: list[str] = []
        self._in_style = False
        self._in_h1 = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name in self.URL_ATTRS:
                if name == "srcset":
                    for part in value.split(","):
                        if part.strip():
                            self.refs.append((tag, name, part.strip().split()[0]))
                else:
                    self.refs.append((tag, name, value))
            elif name == "style":
                self.css.append(value)
        if tag == "style":
            self._in_style = True
        if tag == "h1":
            self._in_h1 = True
            self.h1.append("")

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False
        if tag == "h1":
            self._in_h1 = False

    def handle_data(self, data):
        if self._in_style:
            self.css.append(data)
        if self._in_h1:
            self.h1[-1] += data


def parse(path: Path) -> _Refs:
    p = _Refs()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def html_files(root: Path):
    return sorted(root.rglob("*.html"))


CSS_URL = re.compile(r"""url\(\s*(['"]?)([^'")]+)\1\s*\)""")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)   # http://, https://, //host


def is_external(url: str) -> bool:
    return bool(EXTERNAL.match(url.strip()))


def squash(text: str) -> str:
    return re.sub(r"[\s\u200b¶]+", "", text)


# --------------------------------------------------------------------------- pages

def test_config_is_offline_first():
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s*language:\s*zh\s*$", text, re.M)
    assert re.search(r"^\s*font:\s*false", text, re.M), "theme.font must be false (no Google Fonts)"
    # Material's bundle fetches repository facts from api.github.com when repo_url is set.
    assert not re.search(r"^repo_url:", text, re.M), "repo_url makes the site call api.github.com"
    assert "content.code.copy" in text
    assert re.search(r"jieba_dict_user:\s*docs/assets/jieba_user_dict\.txt", text)


def test_all_chapter_pages_exist_with_titles(site):
    for n, title in CHAPTERS.items():
        page = site / "chapters" / f"ch{n:02d}" / "index.html"
        assert page.is_file(), f"missing chapter page {page.relative_to(site)}"
        h1 = parse(page).h1
        assert len(h1) == 1, f"ch{n:02d}: expected one h1, got {h1}"
        assert squash(h1[0]) == squash(f"第 {n} 章 {title}"), f"ch{n:02d} title: {h1[0]!r}"


def test_every_chapter_is_written(site):
    """All 30 chapters have left the stub stage: no "being written" banner, and every chapter page
    has the sections of the style guide."""
    for n in range(1, 31):
        md = (REPO / "docs" / "chapters" / f"ch{n:02d}.md").read_text(encoding="utf-8")
        html = (site / "chapters" / f"ch{n:02d}" / "index.html").read_text(encoding="utf-8")
        assert "本章正文尚在编写中" not in md and "本章正文尚在编写中" not in html, f"ch{n:02d} is still a stub"
        for heading in ("## 学习目标", "## 动手实践", "## 评分练习", "## 避坑指南", "## 小结", "## 自测题"):
            assert heading in md, f"ch{n:02d} lacks {heading}"


def test_exercise_cards_come_from_the_specs(site):
    """Every graded exercise appears on its chapter page with the spec's own target."""
    from vramlab.exercises import EXERCISES

    for spec in EXERCISES.values():
        stage = re.fullmatch(r"stage(\d)-challenge", spec.id)        # a stage's challenge has its own page
        page = site / ("challenges" if stage else "chapters") / (f"stage{stage.group(1)}" if stage else f"ch{spec.chapter:02d}")
        html = (page / "index.html").read_text(encoding="utf-8")
        assert f"评分练习 <code>{spec.id}</code>" in html, f"{spec.id} has no card on {page.name}"
        if spec.kind == "max_batch":        # judged on the answer and the number of trials, not a ratio
            assert "试得少" in html and "log₂" in html, f"{spec.id}: trial limit missing"
        else:
            assert f"<strong>{spec.target_ratio * 100:g}%</strong>" in html, f"{spec.id}: target missing"
        assert f"exercises/{spec.id}/{spec.id}.ipynb" in html
    learners = (site / "guide" / "learners" / "index.html").read_text(encoding="utf-8")
    for spec in EXERCISES.values():        # the learner guide's table is generated from the same specs
        assert f"<code>{spec.id}</code>" in learners and spec.title in learners, f"{spec.id} missing from the table"


def test_search_words_are_on_their_chapters(site):
    # The browser test searches these words; they must be in the chapters' own text.
    assert "显存" in (site / "chapters/ch01/index.html").read_text(encoding="utf-8")
    assert "梯度检查点" in (site / "chapters/ch07/index.html").read_text(encoding="utf-8")


def test_home_page_links_every_chapter_and_stage(site):
    home = site / "index.html"
    text = home.read_text(encoding="utf-8")
    hrefs = {v for t, a, v in parse(home).refs if t == "a" and a == "href"}
    for n in CHAPTERS:
        assert f"chapters/ch{n:02d}/" in hrefs, f"home page does not link chapter {n}"
    for stage in STAGES:
        assert stage in text
    plain = re.sub(r"<[^>]+>", "", text)
    for word in ("少存", "压缩", "换地方", "112", "mkdocs serve", "file://"):
        assert word in plain, f"home page should mention {word!r}"
    assert 'class="arithmatex"' in text, "home page should contain a formula"


def test_navigation_tabs_and_resources(site):
    text = (site / "index.html").read_text(encoding="utf-8")
    tabs = re.findall(r'<a href="[^"]*" class="md-tabs__link">\s*([^<]+?)\s*</a>', text)
    assert tabs == ["首页", "基础篇", "进阶篇", "高级篇", "实战篇", "练习与评分", "资源"], tabs
    terms = (site / "terms" / "index.html").read_text(encoding="utf-8")
    assert terms.count("<tr>") - terms.count("<thead>") >= 40, "terms page should list at least 40 terms"
    for zh, en in [("显存", "VRAM"), ("激活值", "activations"), ("梯度检查点", "gradient checkpointing"),
                   ("优化器状态", "optimizer state"), ("峰值显存", "peak memory"),
                   ("缓存分配器", "caching allocator"), ("已分配显存", "allocated"), ("已保留显存", "reserved")]:
        assert re.search(rf"<td>{zh}</td>\s*<td>[^<]*{en}", terms, re.I), f"terms table lacks {zh} / {en}"
    assert (site / "style" / "index.html").is_file()


# --------------------------------------------------------------------------- offline-first

OWN_JS = ("assets/js/", "assets/katex/", "assets/vendor/", "assets/calculator/", "assets/timeline/")
# URI strings that are identifiers, not requests (XML namespaces inside KaTeX).
NAMESPACE_URIS = ("http://www.w3.org/1998/Math/MathML", "http://www.w3.org/2000/svg",
                  "http://www.w3.org/1999/xlink", "http://www.w3.org/1999/xhtml")


@pytest.mark.parametrize("which", ["site", "offline_site"])
def test_no_external_assets(which, request):
    root: Path = request.getfixturevalue(which)
    problems = []
    for page in html_files(root):
        p = parse(page)
        rel = page.relative_to(root)
        for tag, attr, url in p.refs:
            if tag == "a":
                continue                      # links in prose may point anywhere
            if is_external(url):
                problems.append(f"{rel}: <{tag} {attr}={url}>")
        for css in p.css:
            for _, url in CSS_URL.findall(css):
                if is_external(url):
                    problems.append(f"{rel}: inline css url({url})")
        text = page.read_text(encoding="utf-8")
        # Material loads mermaid.js from unpkg.com when a page has a mermaid diagram.
        if 'class="mermaid"' in text:
            problems.append(f"{rel}: mermaid diagram (Material would fetch mermaid from unpkg.com)")
        if re.search(r"""import\(\s*["']https?://""", text):
            problems.append(f"{rel}: dynamic import from another host")
    for css in root.rglob("*.css"):
        for _, url in CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            if is_external(url):
                problems.append(f"{css.relative_to(root)}: url({url})")
    for js in root.rglob("*.js"):
        rel = js.relative_to(root).as_posix()
        if not rel.startswith(OWN_JS):
            continue                          # Material's bundle: checked in the browser test
        text = js.read_text(encoding="utf-8", errors="replace")
        for url in re.findall(r"""https?://[^\s"'`)<>]+""", text):
            if not url.startswith(NAMESPACE_URIS):
                problems.append(f"{rel}: {url}")
    assert not problems, "pages reference other hosts:\n" + "\n".join(problems)


def test_no_web_fonts(site):
    text = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text


def test_vendored_katex_is_complete(site):
    css = (site / "assets/katex/katex.min.css").read_text(encoding="utf-8")
    fonts = set(CSS_URL.findall(css))
    assert fonts, "katex.min.css should reference its fonts"
    for _, url in fonts:
        assert (site / "assets/katex" / url).is_file(), f"KaTeX font missing: {url}"
    for f in ("katex.min.js", "contrib/auto-render.min.js"):
        assert (site / "assets/katex" / f).is_file()
    assert (site / "assets/js/katex-init.js").read_text(encoding="utf-8").count("document$") >= 1


def _check_links(root: Path) -> list[str]:
    broken = []
    for page in html_files(root):
        rel = page.relative_to(root)
        refs = [(t, a, v) for t, a, v in parse(page).refs]
        for tag, attr, url in refs:
            if is_external(url) or url.startswith(("#", "mailto:", "data:", "javascript:", "tel:")):
                continue
            path = unquote(urlsplit(url).path)
            if not path:
                continue
            target = (root / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
            target = target.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{rel}: <{tag} {attr}={url}>")
    for css in root.rglob("*.css"):
        for _, url in CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            if is_external(url) or url.startswith("data:"):
                continue
            target = (css.parent / unquote(urlsplit(url).path)).resolve()
            if not target.is_file():
                broken.append(f"{css.relative_to(root)}: url({url})")
    return broken


@pytest.mark.parametrize("which", ["site", "offline_site"])
def test_internal_links_resolve(which, request):
    root: Path = request.getfixturevalue(which)
    broken = _check_links(root)
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_chinese_search_index_is_segmented(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert index["config"]["lang"] == ["zh"]
    assert "\\u200b" in index["config"]["separator"], "separator must split on zero-width spaces"
    text = " ".join(d["title"] + " " + d["text"] for d in index["docs"])
    # jieba splits Chinese with zero-width spaces; the user dictionary keeps course terms whole.
    for term in ("梯度检查点", "激活检查点", "缓存分配器"):
        assert f"\u200b{term}\u200b" in text, f"{term} should be one search token"


def test_offline_build_works_from_files(offline_site):
    index = offline_site / "index.html"
    text = index.read_text(encoding="utf-8")
    # No directory URLs: from file:// a link to chapters/ch01/ would open a folder listing.
    hrefs = [v for t, a, v in parse(index).refs if t == "a" and not is_external(v)]
    assert "chapters/ch01.html" in hrefs
    assert not [h for h in hrefs if h.endswith("/") and not is_external(h)], "directory URLs in offline build"
    # The search index is inlined into a script, as Material's offline plugin does.
    js = (offline_site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert js.startswith("var __index = ")
    data = json.loads(js[len("var __index = "):])
    assert any(d["location"].startswith("chapters/ch01.html") for d in data["docs"])
    # The iframe-worker shim (search from file://) is the vendored copy, not unpkg.com.
    scripts = [v for t, a, v in parse(index).refs if t == "script"]
    assert "assets/vendor/iframe-worker/shim.js" in scripts
    assert "unpkg.com" not in text
    for n in CHAPTERS:
        assert (offline_site / "chapters" / f"ch{n:02d}.html").is_file()


# --------------------------------------------------------------------------- notebooks

NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# 教程：测量峰值\n", "\n", "模型状态 $N \\times 16$ 字节。\n"]},
        {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [
            {"name": "stdout", "output_type": "stream", "text": ["peak: 7925 MiB\n"]}],
         "source": ["print('peak: 7925 MiB')"]},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                 "language_info": {"name": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def test_tutorial_notebook_renders_offline(tmp_path):
    """A committed tutorial (.ipynb with outputs) renders without executing and without CDNs."""
    proj = tmp_path / "proj"                  # the course's config, theme, hooks and assets; two pages
    proj.mkdir()
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    (proj / "mkdocs.yml").write_text(config.split("\nnav:\n", 1)[0] + "\n", encoding="utf-8")
    for part in ("assets", "hooks", "overrides"):
        shutil.copytree(REPO / "docs" / part, proj / "docs" / part)
    (proj / "docs" / "index.md").write_text("# 首页\n", encoding="utf-8")
    (proj / "docs" / "chapters").mkdir()
    nb = proj / "docs" / "chapters" / "ch99_probe.ipynb"
    nb.write_text(json.dumps(NOTEBOOK, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "out"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    env.pop("OFFLINE", None)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-d", str(out)],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = out / "chapters" / "ch99_probe" / "index.html"
    html = page.read_text(encoding="utf-8")
    assert "peak: 7925 MiB" in html, "committed outputs must be shown"
    hrefs = [v for t, a, v in parse(page).refs if t == "a"]
    assert "ch99_probe.ipynb" in hrefs, "download button must use a relative link"
    assert (page.parent / "ch99_probe.ipynb").is_file()
    assert "$N \\times 16$" in html or "N \\times 16" in html, "math is left for KaTeX to render"
    assert "mathjax" not in html.lower() and "cdnjs" not in html
    for tag, attr, url in parse(page).refs:
        assert tag == "a" or not is_external(url), f"notebook page loads {url}"
    assert not [b for b in _check_links(out) if "ch99" in b], "broken links on the notebook page"
