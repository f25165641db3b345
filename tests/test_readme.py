"""README is for users: short, the two commands, links that resolve, no measured timings (those
live in vramlab/data/perf/history.jsonl and the performance page, which must render)."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_gives_the_two_commands():
    assert len(README.encode("utf-8")) <= 8 * 1024
    assert "make serve" in README and "make test" in README


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_readme_carries_no_dated_measurements():
    assert not re.search(r"20\d\d-\d\d-\d\d", README), "dates belong with measurements, on the performance page"
    assert not re.search(r"\d+(\.\d+)?\s*(秒|分钟|分 \d+ 秒|MiB|GiB|倍)", README)


def test_performance_history_renders_every_benchmark_the_page_asks_for():
    import importlib.util
    spec = importlib.util.spec_from_file_location("performance_hook", ROOT / "docs" / "hooks" / "performance.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "dev" / "performance.md").read_text(encoding="utf-8")
    rendered = hook.on_page_markdown(page, None, None, None)
    assert "perf-history" not in rendered and rendered.count("| 日期 |") == len(hook.MARK.findall(page))
    for line in (ROOT / "vramlab" / "data" / "perf" / "history.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        assert entry["command"] and entry["figures"] and entry["date"] and entry["benchmark"]
