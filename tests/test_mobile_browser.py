"""The course website on a phone, and the timeline viewer with mouse and touch, in headless Chromium.

- Every page of the online build, opened at 390 × 844 (a phone), must not scroll sideways: tables
  and code scroll inside their own box, images and SVGs scale down. A page that does names the
  element that sticks out.
- Tutorial pages: code cells use the width of the page (no "In [ ]:" column eating a sixth of it).
- The timeline viewer: a plain click or tap shows the tooltip of the point under it; a drag selects
  a range and zooms; twice in a row, after a click too; with the mouse and with a touch screen
  (synthetic touches through the DevTools protocol, so pointer events really are `touch`); the reset
  control brings back the whole trace. On the phone its labels do not overlap or leave the chart.
- The materials page and the header link to it; the run box on tutorial and exercise pages.

Browser set-up (Debian Chromium, every non-local request aborted and reported) is shared with
tests/test_site_browser.py.
"""
from __future__ import annotations

import io
import json
import re
import urllib.request
import zipfile
from pathlib import Path

import pytest

from site_build import shared_build
from test_site_browser import Watch, browser, site_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

REPO = Path(__file__).resolve().parents[1]
PHONE = {"width": 390, "height": 844}
TRACES = REPO / "docs" / "assets" / "traces"
TIMELINE = ".vramlab-timeline"


# Every URL but the local server's and the local schemes: only these go through Python (Watch._route
# aborts and reports them); routing every request of ~80 pages through Python costs a minute.
NOT_LOCAL = re.compile(r"^(?!(?:https?://(?:127\.0\.0\.1|localhost)(?:[:/]|$)|file:|data:|blob:|about:))")


class PhoneWatch(Watch):
    """Watch's checks (off-machine requests aborted, browser errors kept) in a phone-sized context."""

    def __init__(self, browser):        # noqa: F811 - the fixture's value, not the fixture
        self.context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True, locale="zh-CN",
                                           service_workers="block")
        self.external, self.errors, self.requests = [], [], []
        self.context.route(NOT_LOCAL, self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))


@pytest.fixture
def phone(browser):  # noqa: F811
    w = PhoneWatch(browser)
    yield w
    w.close()


@pytest.fixture
def desktop(browser):  # noqa: F811
    w = Watch(browser)
    yield w
    w.close()


def page_urls(root: Path) -> list[str]:
    """Every page of a build (directory URLs), relative to the site root."""
    urls = []
    for index in sorted(root.rglob("index.html")):
        rel = index.parent.relative_to(root).as_posix()
        if rel.startswith(("assets", "search")):
            continue
        urls.append("" if rel == "." else rel + "/")
    return urls


# The widest element that is not inside something that scrolls or clips it: what to fix.
OVERFLOW_JS = """(limit) => {
  const width = document.scrollingElement.scrollWidth;
  let culprit = null;
  if (width > limit) {
    for (const e of document.body.querySelectorAll('*')) {
      const r = e.getBoundingClientRect();
      if (r.width === 0 || r.right <= limit) continue;
      let clipped = false;
      for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
        if (getComputedStyle(p).overflowX !== 'visible') { clipped = true; break; }
      }
      if (!clipped && (!culprit || r.right > culprit.right))
        culprit = {right: Math.round(r.right), what: e.tagName.toLowerCase() + '.' +
                   String(e.className && e.className.baseVal !== undefined ? e.className.baseVal : e.className)};
    }
  }
  return {width, culprit};
}"""


# --------------------------------------------------------------------------- every page on a phone

def test_no_page_scrolls_sideways_on_a_phone(phone, site_url):  # noqa: F811
    root = shared_build(offline=False)
    urls = page_urls(root)
    assert len(urls) >= 60, urls               # 30 chapters + 30 tutorials + the rest
    # Material's search worker loads and indexes the whole search index on every page (seconds of
    # CPU per page); search is tested in test_site_browser.py, so here the worker is an empty script.
    phone.context.route("**/assets/javascripts/workers/search.*.js",
                        lambda route: route.fulfill(status=200, body="", content_type="text/javascript"))
    page, wide = phone.page, []
    for rel in urls:
        page.goto(site_url + rel, wait_until="load")
        if page.locator(TIMELINE).count():
            page.wait_for_selector(f"{TIMELINE} svg")
        page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        got = page.evaluate(OVERFLOW_JS, PHONE["width"] + 1)
        if got["width"] > PHONE["width"] + 1:
            wide.append(f"{rel or '/'}: {got['width']} px wide, sticking out: {got['culprit']}")
    assert not wide, f"pages wider than a {PHONE['width']} px phone:\n" + "\n".join(wide)
    phone.assert_clean()


def test_tutorial_code_uses_the_width_on_a_phone(phone, site_url):  # noqa: F811
    page = phone.page
    page.goto(site_url + "chapters/ch07-tutorial/", wait_until="load")
    sizes = page.evaluate("""() => {
        const content = document.querySelector('.md-content__inner').getBoundingClientRect();
        const cell = document.querySelector('.jp-CodeCell .jp-InputArea-editor').getBoundingClientRect();
        const prompt = document.querySelector('.jp-CodeCell .jp-InputPrompt');
        return {content: content.width, code: cell.width, prompt: prompt ? prompt.getBoundingClientRect().width : 0};
    }""")
    assert sizes["prompt"] == 0, sizes            # no "In [ ]:" column on a phone
    assert sizes["code"] >= 0.95 * sizes["content"], sizes
    phone.assert_clean()


# --------------------------------------------------------------------------- timeline viewer

def view(page) -> tuple[int, int]:
    lo, hi = page.get_attribute(TIMELINE, "data-view").split("-")
    return int(lo), int(hi)


def plot_box(page) -> dict:
    """The plot area in viewport coordinates (scrolled into view: touches outside the viewport go nowhere)."""
    overlay = page.locator(f"{TIMELINE} svg rect.overlay")
    overlay.scroll_into_view_if_needed()
    return overlay.bounding_box()


def band_hidden(page) -> bool:
    return page.get_attribute(f"{TIMELINE} svg rect.selection", "visibility") == "hidden"


def tip(page):
    return page.locator(f"{TIMELINE} .vramlab-timeline__tip")


def mouse_drag(page, x0, x1, y):
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x1, y, steps=6)
    page.mouse.up()


def mouse_click(page, x, y):
    page.mouse.click(x, y)


def touch_drag(page, x0, x1, y):
    """A finger pressed at x0, slid horizontally to x1 and lifted: Chromium's own touch input."""
    cdp = page.context.new_cdp_session(page)
    try:
        cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x0, "y": y}]})
        for k in range(1, 9):
            cdp.send("Input.dispatchTouchEvent",
                     {"type": "touchMove", "touchPoints": [{"x": x0 + (x1 - x0) * k / 8, "y": y}]})
        cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
    finally:
        cdp.detach()


def touch_tap(page, x, y):
    page.touchscreen.tap(x, y)


def exercise_viewer(page, click, drag, width_limit=None):
    """Click/tap, drag, drag again, click, drag, reset: each step checked."""
    page.wait_for_selector(f"{TIMELINE}[data-trace] svg")
    full = view(page)
    # a plain click/tap shows the point under it and zooms nothing
    b = plot_box(page)
    click(page, b["x"] + b["width"] * 0.5, b["y"] + b["height"] * 0.6)
    assert tip(page).is_visible() and "已分配" in tip(page).inner_text()
    assert view(page) == full and band_hidden(page)
    if width_limit:            # the tooltip stays inside the page
        assert page.evaluate("document.scrollingElement.scrollWidth") <= width_limit
        box = tip(page).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width_limit, box
    # drag: zoom to about 20%..60% of the plot
    drag(page, b["x"] + b["width"] * 0.2, b["x"] + b["width"] * 0.6, b["y"] + b["height"] * 0.5)
    first = view(page)
    span = full[1] - full[0]
    assert full[0] < first[0] < first[1] < full[1], (full, first)
    assert abs((first[1] - first[0]) - 0.4 * span) <= 0.05 * span + 2, (full, first)
    assert band_hidden(page), "the selection band stayed on screen after the drag"
    # drag again, right away, on the redrawn chart
    b = plot_box(page)
    drag(page, b["x"] + b["width"] * 0.7, b["x"] + b["width"] * 0.3, b["y"] + b["height"] * 0.5)   # right to left
    second = view(page)
    assert first[0] <= second[0] < second[1] <= first[1] and second != first, (first, second)
    assert band_hidden(page)
    # a plain click between two drags changes nothing, and the next drag still zooms
    b = plot_box(page)
    click(page, b["x"] + b["width"] * 0.4, b["y"] + b["height"] * 0.5)
    assert view(page) == second and tip(page).is_visible()
    drag(page, b["x"] + b["width"] * 0.1, b["x"] + b["width"] * 0.5, b["y"] + b["height"] * 0.5)
    third = view(page)
    assert second[0] <= third[0] < third[1] <= second[1] and third != second, (second, third)
    assert band_hidden(page)
    # the reset control
    page.locator(f"{TIMELINE} button", has_text="重置缩放").click()
    assert view(page) == full
    # and zooming works once more after the reset
    b = plot_box(page)
    drag(page, b["x"] + b["width"] * 0.5, b["x"] + b["width"] * 0.9, b["y"] + b["height"] * 0.5)
    assert view(page) != full and band_hidden(page)


def test_timeline_zoom_and_tooltip_with_the_mouse(desktop, site_url):  # noqa: F811
    page = desktop.page
    page.goto(site_url + "tools/timeline/", wait_until="load")
    exercise_viewer(page, mouse_click, mouse_drag)
    # hover (no button pressed) follows the pointer
    b = plot_box(page)
    page.mouse.move(b["x"] + b["width"] * 0.1, b["y"] + 20)
    x_left = tip(page).get_attribute("data-x")
    page.mouse.move(b["x"] + b["width"] * 0.9, b["y"] + 20)
    assert tip(page).is_visible() and int(tip(page).get_attribute("data-x")) > int(x_left)
    desktop.assert_clean()


def test_timeline_zoom_and_tooltip_by_touch_on_a_phone(phone, site_url):  # noqa: F811
    page = phone.page
    page.goto(site_url + "tools/timeline/", wait_until="load")
    exercise_viewer(page, touch_tap, touch_drag, width_limit=PHONE["width"] + 1)
    # a tap outside the chart puts the tooltip away
    touch_tap(page, 20, 140)
    assert not tip(page).is_visible()
    phone.assert_clean()


def test_timeline_fits_a_phone_and_its_labels_do_not_collide(phone, site_url):  # noqa: F811
    page = phone.page
    page.goto(site_url + "tools/timeline/", wait_until="load")
    index = json.loads((TRACES / "index.json").read_text(encoding="utf-8"))
    for entry in index:
        page.locator(f"{TIMELINE} select[name=trace]").select_option(entry["name"])
        page.wait_for_selector(f"{TIMELINE}[data-trace={entry['name']}] svg")
        got = page.evaluate("""() => {
            const svg = document.querySelector('.vramlab-timeline svg'), s = svg.getBoundingClientRect();
            const box = document.querySelector('.vramlab-timeline__chart').getBoundingClientRect();
            const texts = [...svg.querySelectorAll('text')].map(t => {
                const r = t.getBoundingClientRect();
                return {cls: t.getAttribute('class'), text: t.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom};
            });
            return {svg: [s.left, s.right], box: [box.left, box.right], texts,
                    page: document.scrollingElement.scrollWidth};
        }""")
        assert got["page"] <= PHONE["width"] + 1, got["page"]
        assert got["svg"][1] <= got["box"][1] + 0.5, "the chart is wider than its container"
        texts = got["texts"]
        assert texts, "no labels at all"
        for t in texts:        # every label inside the chart
            assert t["l"] >= got["svg"][0] - 0.5 and t["r"] <= got["svg"][1] + 0.5, t
        for i, a in enumerate(texts):
            for c in texts[i + 1:]:
                overlap = min(a["r"], c["r"]) - max(a["l"], c["l"]) > 1 and min(a["b"], c["b"]) - max(a["t"], c["t"]) > 1
                assert not overlap, f"{entry['name']}: labels overlap: {a} and {c}"
        marks = [t for t in texts if t["cls"] == "mark-label"]
        assert marks, f"{entry['name']}: every step label was thinned out"
    phone.assert_clean()


# --------------------------------------------------------------------------- materials

def test_materials_page_header_link_and_run_boxes(phone, site_url):  # noqa: F811
    page = phone.page
    page.goto(site_url + "chapters/ch07/", wait_until="load")
    link = page.locator("header a.vramlab-header-materials")
    assert link.count() == 1 and link.is_visible()
    # the exercise card is followed by how to run it; without extra.repo_link: no hosted links
    run = page.locator(".vramlab-run[data-notebook='exercises/ch07-checkpoint/ch07-checkpoint.ipynb']")
    assert run.count() == 1 and "make lab" in run.inner_text()
    assert run.locator("a[href*='colab'], a[href*='kaggle']").count() == 0
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("/materials/"), page.url
    assert page.locator("h1").first.inner_text().replace("¶", "").strip() == "获取课程材料"
    text = page.locator(".md-content").inner_text()
    assert "make site" in text and "extra.repo_link" in text
    # the learner notebooks download is there and is a zip of every exercise notebook
    href = page.locator("a[href$='vramlab-notebooks.zip']").get_attribute("href")
    data = urllib.request.urlopen(site_url + "materials/" + href, timeout=30).read()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    exercises = sorted(p.relative_to(REPO / "exercises").as_posix() for p in (REPO / "exercises").glob("*/*.ipynb"))
    assert sorted(n.split("/", 1)[1] for n in names if n.endswith(".ipynb")) == exercises
    # no offline zip in a plain `mkdocs build`: no link that would 404
    assert page.locator("a[href$='vramlab-offline.zip']").count() == 0
    # a tutorial page says how to run it, right under its title
    page.goto(site_url + "chapters/ch07-tutorial/", wait_until="load")
    box = page.locator(".vramlab-run[data-notebook='docs/chapters/ch07-tutorial.ipynb']")
    assert box.count() == 1 and "jupyter lab docs/chapters/ch07-tutorial.ipynb" in box.inner_text()
    phone.assert_clean()
