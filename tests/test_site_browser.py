"""The course website in a real browser: headless Debian Chromium driven by Playwright.

Serves the online build on 127.0.0.1 and opens the offline build from file://. Every request
the browser makes is routed through a handler that aborts (and records) anything addressed to
another host, so "works offline" is checked, not assumed.

Needs /usr/bin/chromium (`apt-get install -y chromium`) and the `playwright` pip package; the
browser that `playwright install` would download is NOT used. Without Chromium the tests are
skipped, unless CI is set, in which case they fail.
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from site_build import shared_build

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
LOCAL_SCHEMES = {"file", "data", "blob", "about"}


def _require(condition: bool, reason: str):
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason, allow_module_level=True)


_require(Path(CHROMIUM).is_file(), f"{CHROMIUM} not found: apt-get install -y chromium")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    _require(False, "Python package playwright not installed: pip install playwright")
try:
    import mkdocs  # noqa: F401
    import material  # noqa: F401
except ImportError:  # pragma: no cover
    _require(False, "site dependencies not installed: pip install -e '.[site]'")


# --------------------------------------------------------------------------- fixtures

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site_url():
    root = shared_build(offline=False)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def offline_root():
    return shared_build(offline=True)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


class Watch:
    """A browser context whose every request is checked; off-machine requests are aborted."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="zh-CN",
                                           service_workers="block")
        self.external: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def _route(self, route):
        url = route.request.url
        self.requests.append(url)
        parts = urlsplit(url)
        if parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def close(self):
        self.context.close()

    def assert_clean(self):
        assert not self.external, "requests tried to leave the machine:\n" + "\n".join(self.external)
        assert not self.errors, "browser errors:\n" + "\n".join(self.errors)


@pytest.fixture
def watch(browser):
    w = Watch(browser)
    yield w
    w.close()


def h1(page) -> str:
    """Text of the page's h1 without the permalink anchor."""
    return page.locator("h1").first.inner_text().replace("¶", "").strip()


def search(page, query: str, timeout_s: float = 20.0) -> list[str]:
    """Type a query into Material's search box; return the result links (page URLs)."""
    box = page.locator("input.md-search__input")
    box.click()
    deadline = time.monotonic() + timeout_s
    while True:
        # Material reacts to key events; fill() alone does not start a search.
        box.fill(query)
        page.keyboard.press("End")
        try:
            page.wait_for_selector("a.md-search-result__link", timeout=2000)
            break
        except Exception:
            if time.monotonic() > deadline:
                meta = page.locator(".md-search-result__meta").inner_text()
                raise AssertionError(f"search for {query!r} showed no results: {meta!r}")
    page.wait_for_timeout(300)   # let the result list settle on the final query
    return [a.get_attribute("href") for a in page.query_selector_all("a.md-search-result__link")]


# --------------------------------------------------------------------------- online build

def test_home_page_loads_everything_locally(watch, site_url):
    page = watch.page
    page.goto(site_url, wait_until="networkidle")
    assert h1(page) == "显存优化实战"
    tabs = [t.strip() for t in page.locator(".md-tabs__link").all_inner_texts()]
    assert tabs == ["首页", "基础篇", "进阶篇", "高级篇", "实战篇", "练习与评分", "资源"], tabs
    # Formulas are rendered by the vendored KaTeX.
    page.wait_for_selector(".arithmatex .katex", timeout=10000)
    assert page.locator(".arithmatex .katex").count() >= 2
    assert page.locator(".katex-error").count() == 0, "a formula failed to parse"
    # Code blocks get Material's copy button.
    assert page.locator("pre .md-code__button, pre .md-clipboard, .md-code__nav button").count() >= 1
    assert any(u.startswith(site_url) and u.endswith(".js") for u in watch.requests)
    watch.assert_clean()


@pytest.mark.parametrize("query, chapter, title", [
    ("显存", "ch01", "显存基础认知"),
    ("梯度检查点", "ch07", "激活检查点"),
])
def test_chinese_search(watch, site_url, query, chapter, title):
    page = watch.page
    page.goto(site_url, wait_until="networkidle")
    links = search(page, query)
    hits = [h for h in links if f"/chapters/{chapter}/" in h]
    assert hits, f"searching {query!r} should find chapter {chapter} ({title}); got {links[:12]}"
    page.goto(hits[0].split("#")[0])
    assert title in h1(page)
    watch.assert_clean()


def test_chapter_page_and_collapsible_answer(watch, site_url):
    page = watch.page
    page.goto(site_url + "chapters/ch20/", wait_until="networkidle")
    assert h1(page) == "第 20 章 分布式训练显存"
    question = page.locator("details.success").first                   # 自测题: answers start closed
    assert question.get_attribute("open") is None
    question.locator("summary").click()
    assert question.get_attribute("open") is not None
    nav = page.locator(".md-nav__link").all_inner_texts()
    assert any("第 16 章" in t for t in nav) and any("第 25 章" in t for t in nav)
    # The style guide shows a collapsible answer (pymdownx.details), closed until clicked.
    page.goto(site_url + "style/", wait_until="networkidle")
    answer = page.locator("details.success").first
    assert answer.get_attribute("open") is None
    answer.locator("summary").click()
    assert answer.get_attribute("open") is not None
    assert answer.locator("p").first.is_visible()
    watch.assert_clean()


def test_content_tabs_switch(watch, site_url):
    page = watch.page
    page.goto(site_url, wait_until="networkidle")
    tabs = page.locator(".tabbed-set").first
    labels = tabs.locator(".tabbed-labels > label")
    assert labels.all_inner_texts() == ["本地服务器", "直接打开文件"]
    assert "mkdocs serve" in tabs.locator(".tabbed-block").nth(0).inner_text()
    labels.nth(1).click()
    second = tabs.locator(".tabbed-block").nth(1)
    assert second.is_visible() and "site-offline" in second.inner_text()
    watch.assert_clean()


def test_terms_page_has_formula_and_table(watch, site_url):
    page = watch.page
    page.goto(site_url + "terms/", wait_until="networkidle")
    page.wait_for_selector(".arithmatex .katex", timeout=10000)
    rows = page.locator("table tbody tr").count()
    assert rows >= 40, rows
    watch.assert_clean()


def test_tutorial_page_shows_its_outputs(watch, site_url):
    """A tutorial page shows the outputs it was committed with, its figures, and a download link."""
    import nbformat

    nb = nbformat.read(REPO / "docs" / "chapters" / "ch01-tutorial.ipynb", as_version=4)
    printed = [o["text"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.get("output_type") == "stream" and o["text"].strip()]
    assert printed, "the committed tutorial has no printed output"
    page = watch.page
    page.goto(site_url + "chapters/ch01-tutorial/", wait_until="networkidle")
    body = page.locator(".md-content").inner_text()
    first_line = printed[0].strip().splitlines()[0].strip()
    assert first_line in body, f"output {first_line!r} not shown on the page"
    assert page.locator(".jp-OutputArea-output, .output_area").count() >= 3
    download = page.locator("a[href$='.ipynb']").first
    assert download.count() == 1
    watch.assert_clean()


# --------------------------------------------------------------------------- offline build

def test_offline_build_from_file_url(watch, offline_root):
    page = watch.page
    page.goto((offline_root / "index.html").as_uri(), wait_until="load")
    assert h1(page) == "显存优化实战"
    tabs = page.locator(".md-tabs__link")
    assert tabs.count() == 7
    # Navigation: follow the 基础篇 tab to chapter 1.
    tabs.nth(1).click()
    page.wait_for_load_state("load")
    assert page.url.startswith("file://") and page.url.endswith("chapters/ch01.html"), page.url
    assert "显存基础认知" in h1(page)
    # The sidebar lists the stage's chapters; follow one of them.
    side = page.locator(".md-sidebar--primary a.md-nav__link", has_text="第 2 章 显存监控工具")
    side.first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("chapters/ch02.html"), page.url
    assert h1(page) == "第 2 章 显存监控工具"
    # Search from file:// (index inlined in search_index.js, worker shimmed by iframe-worker).
    links = search(page, "梯度检查点")
    assert any(h.startswith("file://") and "chapters/ch07.html" in h for h in links), links[:12]
    page.goto((offline_root / "index.html").as_uri(), wait_until="load")
    page.wait_for_selector(".arithmatex .katex", timeout=10000)
    assert not [u for u in watch.requests if urlsplit(u).scheme in ("http", "https")], \
        "the offline build should not make any http(s) request"
    watch.assert_clean()


def test_screenshots(watch, site_url, tmp_path):
    """Renders the home page and a chapter page; the PNGs are kept for a human to look at."""
    out = Path(os.environ.get("VRAMLAB_SCREENSHOT_DIR", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    page = watch.page
    for name, url in [("home", site_url), ("ch07", site_url + "chapters/ch07/")]:
        page.goto(url, wait_until="networkidle")
        page.wait_for_timeout(200)
        path = out / f"{name}.png"
        page.screenshot(path=str(path), full_page=(name == "home"))
        assert path.stat().st_size > 10_000
    watch.assert_clean()
