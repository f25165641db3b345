"""Search benchmark: the course's own terms, typed into Material's search box in a real browser.

Each term must bring the page that explains it among the first three pages of the result list
(a page counts once, at the place of its best section). The index is cut with jieba and
docs/assets/jieba_user_dict.txt; the browser cuts queries with the index's own vocabulary
(docs/hooks/search_query.py + docs/assets/js/search-query.js), and headings weigh more than
body text (Material's field boosts, mkdocs.yml `search: fields`). Material's own query cutting
got 梯度检查点 wrong (chapter 7 not in the first eight: it searched "梯度* 检查*").

Every target was checked by reading the chapter: the page has the term in its title or in a
heading of its own and explains it there (the third column says where).

Headless Debian Chromium via Playwright, as tests/test_site_browser.py; without Chromium the
tests are skipped, unless CI is set.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from site_build import node_or_skip, shared_build
from test_site_browser import browser, site_url  # noqa: F401  (fixtures; its guards skip or fail without Chromium)

pytestmark = pytest.mark.slow       # starts a browser and builds the site: `make test`, not `make check`

TOP = 3

# (query, the page it must find in its first TOP pages, where that page explains it)
BENCHMARK = [
    ("梯度检查点", "chapters/ch07/", "## 名字的来历：“梯度检查点”与“激活检查点”"),
    ("gradient checkpointing", "chapters/ch07/", "同上；术语表: gradient checkpointing = 梯度检查点"),
    ("激活检查点", "chapters/ch07/", "# 第 7 章 激活检查点"),
    ("ZeRO", "chapters/ch10/", "## ZeRO：把重复的状态切开"),
    ("FSDP", "chapters/ch10/", "## FSDP：PyTorch 里的 ZeRO-3"),
    ("显存碎片", "chapters/ch11/", "## 显存碎片检测"),
    ("缓存分配器", "chapters/ch11/", "## CUDA 内存池：缓存分配器怎样管显存"),
    ("empty_cache", "chapters/ch11/", "## `torch.cuda.empty_cache()` 的陷阱"),
    ("LoRA", "chapters/ch24/", "# 第 24 章 LoRA 微调显存优化"),
    ("QLoRA", "chapters/ch24/", "## QLoRA 实践"),
    ("AdaLoRA", "chapters/ch25/", "# 第 25 章 AdaLoRA 与 DoRA"),
    ("DoRA", "chapters/ch25/", "## DoRA：把权重拆成幅度和方向"),
    ("Prefix Tuning", "chapters/ch26/", "## Prefix Tuning 的显存分析"),
    ("P-Tuning v2", "chapters/ch27/", "# 第 27 章 P-Tuning v2"),
    ("混合精度", "chapters/ch06/", "# 第 6 章 混合精度训练（AMP）"),
    ("损失缩放", "chapters/ch06/", "## FP16 与损失缩放"),
    ("优化器状态", "chapters/ch19/", "## 优化器状态卸载; ## AdamW 的显存账"),
    ("8-bit 优化器", "chapters/ch19/", "## 8-bit 优化器：分块动态量化"),
    ("流水线并行", "chapters/ch09/", "## 流水线并行：把层分给不同的卡"),
    ("张量并行", "chapters/ch09/", "## 张量并行：把一层切开"),
    ("序列并行", "chapters/ch09/", "## 序列并行：把剩下的激活值也切开"),
    ("KV cache", "chapters/ch16/", "### 推理：键值缓存 (术语表: key-value cache (KV cache) = 键值缓存)"),
    ("KV 缓存", "chapters/ch16/", "同上"),
    ("GQA", "chapters/ch16/", "## 分组查询注意力（GQA）"),
    ("FlashAttention", "chapters/ch14/", "## Flash Attention 原理"),
    ("量化", "chapters/ch22/", "# 第 22 章 模型量化技术"),
    ("卸载", "chapters/ch28/", "# 第 28 章 模型卸载（Offloading）"),
    ("offload", "chapters/ch28/", "同上"),
    ("梯度累积", "chapters/ch05/", "# 第 5 章 梯度累积技术"),
    ("梯度压缩", "chapters/ch08/", "# 第 8 章 梯度压缩与通信优化"),
    ("知识蒸馏", "chapters/ch23/", "# 第 23 章 知识蒸馏与显存"),
    ("锁页内存", "chapters/ch04/", "## 锁页内存与 non_blocking"),
    ("pinned memory", "chapters/ch04/", "同上；术语表: pinned memory = 锁页内存"),
    ("专家并行", "chapters/ch17/", "## 专家并行策略"),
    ("MoE", "chapters/ch17/", "## MoE 的显存分析"),
    ("RMSNorm", "chapters/ch18/", "### RMSNorm"),
    ("显存溢出", "chapters/ch21/", "# 第 21 章 显存溢出（OOM）排查"),
    ("nvidia-smi", "chapters/ch02/", "## nvidia-smi 详解"),
    ("inference_mode", "chapters/ch12/", "## `torch.no_grad` 与 `torch.inference_mode`"),
    ("批大小", "chapters/ch13/", "## 批大小与显存的关系"),
    ("NCCL", "chapters/ch20/", "## NCCL：通信库怎么配"),
    ("safetensors", "chapters/ch03/", "## safetensors：零复制、不执行代码"),
]


class _Tab:
    """One browser tab whose requests may not leave the machine, with its errors recorded."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="zh-CN",
                                           service_workers="block")
        self.external: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _route(self, route):
        parts = urlsplit(route.request.url)
        if parts.scheme in ("file", "data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            self.external.append(route.request.url)
            route.abort()

    def assert_clean(self):
        assert not self.external, f"requests left the machine: {self.external}"
        assert not self.errors, f"browser errors or warnings (an invalid query warns): {self.errors}"


@pytest.fixture(scope="module")
def _module_tab(browser, site_url):
    tab = _Tab(browser)
    tab.page.goto(site_url, wait_until="networkidle")
    yield tab
    tab.context.close()


@pytest.fixture
def search_tab(_module_tab):
    """The module's tab with its records emptied: a test reports only what its own queries caused
    (one query's error once failed every test after it)."""
    _module_tab.errors.clear()
    _module_tab.external.clear()
    return _module_tab


def _links(page) -> list[str]:
    return page.eval_on_selector_all("a.md-search-result__link", "els => els.map(e => e.href)")


def search(page, query: str, timeout_s: float = 20.0) -> list[str]:
    """Type `query` into Material's search box (after clearing it, so that no earlier result is
    read) and return the result links once the list has stopped changing."""
    box = page.locator("input.md-search__input")
    box.click()
    box.fill("")
    page.keyboard.press("End")          # Material reacts to key events; fill() alone searches nothing
    page.wait_for_function("() => !document.querySelector('a.md-search-result__link')", timeout=10000)
    box.fill(query)
    page.keyboard.press("End")
    deadline = time.monotonic() + timeout_s
    seen, stable = None, 0
    while stable < 3:
        if time.monotonic() > deadline:
            meta = page.locator(".md-search-result__meta").inner_text()
            raise AssertionError(f"no settled results for {query!r}: {meta!r}, last {seen}")
        page.wait_for_timeout(150)
        links = _links(page)
        stable = stable + 1 if links and links == seen else 0
        seen = links
    return seen


def pages_in_order(links: list[str], root: str) -> list[str]:
    """Distinct pages of the result links, in order: no #section, no ?h= highlight."""
    out: list[str] = []
    for link in links:
        parts = urlsplit(link)
        path = unquote(parts.path)
        page = path[len(urlsplit(root).path):] if path.startswith(urlsplit(root).path) else path
        if page not in out:
            out.append(page)
    return out


def rank(pages: list[str], target: str) -> int | None:
    return pages.index(target) + 1 if target in pages else None


@pytest.mark.parametrize("query, target, where", BENCHMARK, ids=[b[0] for b in BENCHMARK])
def test_term_finds_its_chapter(search_tab, site_url, query, target, where):
    pages = pages_in_order(search(search_tab.page, query), site_url)
    r = rank(pages, target)
    assert r is not None and r <= TOP, (
        f"searching {query!r} should list {target} ({where}) among the first {TOP} pages; "
        f"it is {'not listed' if r is None else f'#{r}'}: {pages[:8]}")
    search_tab.assert_clean()


def _worker_check(site: Path, queries: list[str]) -> dict:
    node = node_or_skip("在 node 里跑一遍站点的搜索 worker")
    run = subprocess.run([node, str(Path(__file__).resolve().parents[1] / "scripts" / "search_worker_check.js"),
                          str(site), *queries], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


# every word of the index begins with one of these, so their prefix queries reach every word
PREFIXES = list("abcdefghijklmnopqrstuvwxyz0123456789_")


@pytest.mark.parametrize("offline", [False, True], ids=["served", "offline"])
def test_the_worker_searches_exactly_the_words_of_the_index(offline):
    """lunr's token set (what prefix and fuzzy queries expand against) must hold exactly the inverted
    index's words. lunr 2.3.9's builder merged look-alike nodes when the vocabulary had digits
    (code on the pages), inventing words that made a prefix query throw ("P-Tuning v2" and
    "8-bit 优化器" found nothing: Material printed "Invalid query") and losing real ones
    ("28.00", "mib(10"); docs/assets/js/search-query.js mends it. No browser: the built worker
    runs in node on the built index, every one-character prefix and every benchmark query."""
    result = _worker_check(shared_build(offline=offline), PREFIXES + [q for q, _, _ in BENCHMARK])
    assert result["words"] > 10000, result["words"]
    assert not result["invented"], f"the token set has words the index lacks: {result['invented'][:10]}"
    assert not result["lost"], f"the token set lacks words of the index: {result['lost'][:10]}"
    failed = {q: r["warning"] for q, r in result["queries"].items() if r["warning"]}
    assert not failed, f"queries the worker refused: {failed}"
    empty = [q for q, _, _ in BENCHMARK if result["queries"][q]["results"] == 0]
    assert not empty, f"benchmark queries with no result at all: {empty}"


def test_benchmark_is_large_enough_and_checked_by_hand():
    assert len(BENCHMARK) >= 25
    assert len({q for q, _, _ in BENCHMARK}) == len(BENCHMARK), "a query is listed twice"
    repo = Path(__file__).resolve().parents[1]
    for query, target, where in BENCHMARK:
        source = repo / "docs" / (target.rstrip("/") + ".md")
        assert source.is_file(), f"{query}: {target} is not a Markdown page"
        if where.startswith("同上"):          # "the same as the line above"
            continue
        heading = where.split(";")[0].split(" (")[0].lstrip("#").strip()
        assert heading in source.read_text(encoding="utf-8"), f"{query}: {source.name} has no {heading!r}"


@pytest.mark.parametrize("query", ["梯度检查点", "激活检查点", "显存碎片", "优化器状态"])
def test_course_terms_are_searched_whole(search_tab, site_url, query):
    """The index keeps these terms whole (jieba user dictionary); the query must too: the best
    result's highlight terms (Material's ?h=) are the whole term, not its pieces."""
    links = search(search_tab.page, query)
    terms = parse_qs(urlsplit(links[0]).query).get("h", [""])[0].split()
    assert query in terms, f"the best result for {query!r} matched {terms}, not the whole term: {links[0]}"
    search_tab.assert_clean()


def test_offline_build_searches_with_the_same_cutting(browser):
    """From file:// the worker runs in the iframe-worker shim; it is the segmented one there too."""
    root = shared_build(offline=True)
    tab = _Tab(browser)
    try:
        page = tab.page
        page.goto((root / "chapters" / "ch12.html").as_uri(), wait_until="load")
        config = page.eval_on_selector("#__config", "e => JSON.parse(e.textContent)")
        assert "/workers/search-segmented." in config["search"], config["search"]
        for query, target in (("梯度检查点", "chapters/ch07.html"), ("KV cache", "chapters/ch16.html")):
            pages = pages_in_order(search(page, query), root.as_uri() + "/")
            assert (rank(pages, target) or 99) <= TOP, f"{query!r} from file://: {pages[:8]}"
        tab.assert_clean()
    finally:
        tab.context.close()
