"""Every in-site link of the built course site lands somewhere: on an existing page and, when it
has a #fragment, on an element with that id; no page has two elements with the same id; the
tables of contents read as text (no TeX source, no "¶", no empty entries).

The builds are the shared ones of this test run (tests/site_build.py): online (directory URLs,
served from a web server) and OFFLINE=true (plain .html files, opened from file://). tests/
test_site.py checks that linked files exist; here the anchors are checked too, which is where
tutorial notebooks went wrong (mkdocs-jupyter gave TOC entries other ids than the headings).

The TeX-to-text conversion of docs/hooks/headings.py is unit-tested at the end (no build).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow             # the tests that need a site build start mkdocs


@pytest.fixture(scope="module")
def builds():
    pytest.importorskip("mkdocs", reason="网站依赖未安装: pip install -e '.[site]'")
    pytest.importorskip("material", reason="网站依赖未安装: pip install -e '.[site]'")
    from site_build import shared_build

    return {"site": shared_build(offline=False), "offline_site": shared_build(offline=True)}


# --------------------------------------------------------------------------- parsing

class _Page(HTMLParser):
    """Ids, links and table-of-contents entries of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: list[str] = []
        self.links: list[str] = []
        self.toc: list[tuple[str, str]] = []         # (href, text) of the page's own TOC
        self._toc_depth = 0                          # inside nav.md-nav--secondary
        self._stack: list[str] = []
        self._entry: list[str] | None = None
        self._entry_href = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a" and "name" in a and a["name"] != a.get("id"):     # <a id=x name=x>: one target
            self.ids.append(a["name"])
        if tag == "a" and a.get("href") is not None:
            self.links.append(a["href"])
        if tag in ("br", "img", "input", "link", "meta", "hr", "source", "wbr", "area", "col", "embed",
                   "param", "track", "base"):
            return
        self._stack.append(tag)
        if tag == "nav" and "md-nav--secondary" in (a.get("class") or ""):
            self._toc_depth = len(self._stack)
        if self._toc_depth and tag == "a" and "md-nav__link" in (a.get("class") or ""):
            self._entry, self._entry_href = [], a.get("href", "")

    def handle_endtag(self, tag):
        if tag == "a" and self._entry is not None:
            self.toc.append((self._entry_href, " ".join("".join(self._entry).split())))
            self._entry = None
        while self._stack:
            open_tag = self._stack.pop()
            if self._toc_depth and len(self._stack) < self._toc_depth:
                self._toc_depth = 0
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._entry is not None:
            self._entry.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def _pages(root: Path) -> dict[Path, _Page]:
    return {p: _parse(p) for p in sorted(root.rglob("*.html"))}


def _target(root: Path, page: Path, href: str) -> tuple[Path | None, str]:
    """The file an in-site href points at (None for off-site links) and its fragment."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:", "data:")):
        return None, ""
    fragment = unquote(parts.fragment)
    if not parts.path:
        return page, fragment
    base = root if parts.path.startswith("/") else page.parent     # 404.html links from the site root
    target = Path(os.path.normpath(base / unquote(parts.path).lstrip("/")))
    if target.is_dir() or parts.path.endswith("/"):
        target = target / "index.html"
    return target, fragment


def broken_links(root: Path, pages: dict[Path, _Page]) -> list[str]:
    ids = {p: set(parsed.ids) for p, parsed in pages.items()}
    broken = []
    for page, parsed in pages.items():
        for href in parsed.links:
            target, fragment = _target(root, page, href)
            if target is None:
                continue
            where = f"{page.relative_to(root)}: {href}"
            if not target.is_file():
                broken.append(f"{where} -> no file {target}")
            elif fragment and target.suffix == ".html" and fragment not in ids.get(target, set()):
                broken.append(f"{where} -> {target.relative_to(root)} has no id {fragment!r}")
    return broken


def duplicate_ids(root: Path, pages: dict[Path, _Page]) -> list[str]:
    out = []
    for page, parsed in pages.items():
        twice = sorted(i for i, n in Counter(parsed.ids).items() if n > 1)
        if twice:
            out.append(f"{page.relative_to(root)}: {twice}")
    return out


_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\\[A-Za-z]+\{|\$[^$\s][^$]*\$")


def unreadable_toc_entries(root: Path, pages: dict[Path, _Page]) -> list[str]:
    out = []
    for page, parsed in pages.items():
        for href, text in parsed.toc:
            if not href.startswith("#"):
                continue
            if not text or "¶" in text or _TEX.search(text) or re.search(r"[：:、，(（]\s*$|、、", text):
                out.append(f"{page.relative_to(root)}: {href} {text!r}")
    return out


# --------------------------------------------------------------------------- built site

@slow
@pytest.mark.parametrize("which", ["site", "offline_site"])
def test_every_internal_link_and_anchor_resolves(builds, which):
    root = builds[which]
    pages = _pages(root)
    assert len(pages) > 60, f"only {len(pages)} pages in {root}"
    n_links = sum(len(p.links) for p in pages.values())
    n_anchors = sum(1 for p in pages.values() for h in p.links if "#" in h and not urlsplit(h).scheme)
    assert n_links > 1000 and n_anchors > 1000, (n_links, n_anchors)      # the parser saw the pages
    broken = broken_links(root, pages)
    assert not broken, f"{len(broken)} links go nowhere:\n" + "\n".join(broken[:80])


@slow
@pytest.mark.parametrize("which", ["site", "offline_site"])
def test_no_page_has_duplicate_ids(builds, which):
    root = builds[which]
    dups = duplicate_ids(root, _pages(root))
    assert not dups, "pages with an id used twice:\n" + "\n".join(dups)


@slow
def test_table_of_contents_reads_as_text(builds):
    root = builds["site"]
    pages = _pages(root)
    entries = [(p, t) for p, parsed in pages.items() for t in parsed.toc if t[0].startswith("#")]
    assert len(entries) > 500, len(entries)
    bad = unreadable_toc_entries(root, pages)
    assert not bad, "TOC entries with TeX, ¶ or missing words:\n" + "\n".join(bad)
    # the headings with formulas, as text
    toc = {t for parsed in pages.values() for _, t in parsed.toc}
    for text in ("Chen 等人的 √n 分段", "权重：4h²", "激活值：每层 4sbh 字节从哪里来", "logit 蒸馏：温度与 T²",
                 "f 和 g：一对共轭算子"):
        assert text in toc, f"{text!r} not in any table of contents"
    # inline code stays in notebook headings (it was dropped: "评估循环：不加、、")
    nb = pages[root / "chapters" / "ch12-tutorial" / "index.html"]
    assert "1. 评估循环：不加、no_grad、inference_mode" in [t for _, t in nb.toc], nb.toc[:8]


@slow
def test_search_index_has_no_tex_or_pilcrows(builds):
    index = json.loads((builds["site"] / "search" / "search_index.json").read_text(encoding="utf-8"))
    bad = []
    for doc in index["docs"]:
        title = doc["title"]
        text = re.sub(r"<(code|pre)>.*?</\1>", "", doc["text"], flags=re.S)
        if "¶" in title or _TEX.search(title):
            bad.append(f"{doc['location']}: title {title[:60]!r}")
        elif m := re.search(r".{0,30}(\\\(|\\\[).{0,30}", text):
            bad.append(f"{doc['location']}: text {m.group(0)!r}")
    assert not bad, "search titles/text with TeX source or ¶:\n" + "\n".join(bad[:40])
    titles = {d["location"].split("#")[0]: d["title"] for d in index["docs"] if "sqrtn" in d["location"]}
    assert titles and all("√n" in t for t in titles.values()), titles


# --------------------------------------------------------------------------- the checker itself

def _write(path: Path, body: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<html><body>{body}</body></html>", encoding="utf-8")


def test_checker_finds_broken_anchors_and_duplicate_ids(tmp_path):
    _write(tmp_path / "index.html", '<h1 id="top">t</h1><a href="a/">ok</a><a href="a/#x">ok</a>'
                                    '<a href="a/#nope">bad</a><a href="#top">ok</a><a href="#gone">bad</a>'
                                    '<a href="b/">bad</a><a href="https://example.org/#q">off-site</a>')
    _write(tmp_path / "a" / "index.html", '<h2 id="x">x</h2><p id="x">again</p><a href="../#top">ok</a>')
    pages = _pages(tmp_path)
    broken = broken_links(tmp_path, pages)
    assert len(broken) == 3 and any("'nope'" in b for b in broken) and any("'gone'" in b for b in broken), broken
    assert any("no file" in b for b in broken)
    assert duplicate_ids(tmp_path, pages) == ["a/index.html: ['x']"]


def test_checker_reads_toc_entries(tmp_path):
    _write(tmp_path / "index.html",
           '<nav class="md-nav md-nav--secondary"><ul><li><a class="md-nav__link" href="#a"><span>1. 不加、、</span>'
           '</a></li><li><a class="md-nav__link" href="#b"> Chen 的 \\(\\sqrt{n}\\) </a></li>'
           '<li><a class="md-nav__link" href="#c">好的标题</a></li></ul></nav><a class="md-nav__link" href="#d">x¶</a>')
    bad = unreadable_toc_entries(tmp_path, _pages(tmp_path))
    assert len(bad) == 2 and "#a" in bad[0] and "#b" in bad[1], bad


# --------------------------------------------------------------------------- TeX as text

def _headings_hook():
    pytest.importorskip("mkdocs", reason="网站依赖未安装: pip install -e '.[site]'")
    spec = importlib.util.spec_from_file_location("vramlab_docs_headings", REPO / "docs" / "hooks" / "headings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tex, text", [
    (r"\sqrt{n}", "√n"), ("4h^2", "4h²"), ("T^2", "T²"), ("2(N-1)/N", "2(N-1)/N"),
    (r"W_0 x + \frac{\alpha}{r} B A x", "W₀ x + α/r B A x"), (r"x^{-1}", "x⁻¹"), (r"A^\top", "Aᵀ"),
    (r"\hat{m}_t = \frac{m_t}{1-\beta_1^t}", "m̂ₜ = mₜ/(1-β₁ᵗ)"), (r"N \times 16", "N × 16"),
    (r"\left\lceil \frac{N}{p} \right\rceil", "⌈ N/p ⌉"), (r"\underbrace{2\Psi}_{\text{参数}} + 12\Psi", "2Ψ + 12Ψ"),
    (r"d_{\text{model}}", "d_model"), (r"\sqrt[3]{x+1}", "³√(x+1)"),
])
def test_tex_to_text(tex, text):
    out, unknown = _headings_hook().tex_to_text(tex)
    assert (out, unknown) == (text, set())


def test_tex_to_text_reports_what_it_does_not_know():
    out, unknown = _headings_hook().tex_to_text(r"\weird{x} + 1")
    assert unknown == {r"\weird"} and out == "weirdx + 1"


def test_math_in_html_text_but_not_in_code():
    hook = _headings_hook()
    html = r"约 \(N \times 16\) 字节，<code>\(x\)</code>，$a_1$ 与 $$b^2$$，a &lt; \(a &lt; b\)"
    assert hook.math_to_text(html, dollars=True) == "约 N × 16 字节，<code>\\(x\\)</code>，a₁ 与 b²，a &lt; a &lt; b"
    assert hook.math_to_text("价格 $5 与 $6", dollars=True) == "价格 $5 与 $6"     # no formula there
    assert hook.math_to_text("$a$", dollars=False) == "$a$"
