"""The site's two tools in headless Chromium: the VRAM calculator and the memory-timeline viewer.

The calculator is a JavaScript port of `vramlab.estimate`; here the browser fills the form for a
table of workloads and every byte it shows must equal the Python estimate. The timeline viewer must
render the committed traces, switch between them, zoom, and open a file the reader picks.
Browser set-up (Debian Chromium, every non-local request aborted and reported) is shared with
tests/test_site_browser.py.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_site_browser import browser, offline_root, site_url, watch  # noqa: F401  (fixtures)
from vramlab.estimate import estimate
from vramlab.trace.format import Event, build_trace
from vramlab.webdata import CARDS_GB, CONTEXT_RESERVE_BYTES, fit_verdict
from vramlab.workload import Workload, WorkloadError

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "docs" / "assets" / "traces"

# (Workload fields, qlora): presets × precision × optimizer × checkpointing × ZeRO × GPUs × LoRA × offload
CASES = [
    (dict(model="gpt2-small", batch=8, seq=512), False),
    (dict(model="gpt2-small", batch=8, seq=512, precision="bf16-mixed", checkpointing="full"), False),
    (dict(model="gpt2-medium", batch=4, seq=1024, precision="fp16-mixed", optimizer="adamw8bit",
          checkpointing="selective", attention="eager", dropout=0.1), False),
    (dict(model="gpt2-small", batch=16, seq=512, precision="bf16", optimizer="sgdm"), False),
    (dict(model="llama-7b", batch=1, seq=1024, precision="bf16-mixed", zero=3, gpus=8), False),
    (dict(model="llama-7b", batch=1, seq=2048, precision="bf16", lora_rank=16), True),
    (dict(model="llama-1b", batch=2, seq=1024, precision="bf16-mixed", optimizer="adafactor", zero=1, gpus=4,
          checkpointing="full"), False),
    (dict(model="bert-base", batch=16, seq=512, precision="fp16-mixed", zero=2, gpus=2,
          offload="activations"), False),
    (dict(model="moe-tiny", batch=4, seq=256, lora_rank=8, attention="eager"), False),
    (dict(model="gpt2-xl", batch=2, seq=1024, precision="bf16-mixed", accum=4, foreach=False), False),
    (dict(model="gpt2-large", batch=8, seq=1024, optimizer="sgd", offload="activations", attention="eager"), False),
    (dict(model="llama-tiny-mqa", batch=8, seq=512, precision="fp16", optimizer="adafactor",
          checkpointing="selective", attention="eager", dropout=0.1), False),
    (dict(model="gpt2-mini", batch=8, seq=1024, zero=3, gpus=2), False),
    (dict(model="bert-tiny", batch=8, seq=128, lora_rank=4, attention="eager", dropout=0.1), False),
    (dict(model="gpt2-small", batch=8, seq=512, precision="bf16-mixed", inference=True), False),
    (dict(model="llama-7b", batch=4, seq=4096, precision="bf16-mixed", checkpointing="full", zero=3, gpus=64), False),
    # the options of issue 30: LoRA targets, QLoRA in every precision, 8-bit AdamW's per-tensor state
    (dict(model="llama-7b", batch=1, seq=2048, precision="bf16-mixed", lora_rank=16, lora_targets="all-linear",
          checkpointing="full"), False),
    (dict(model="llama-1b", batch=2, seq=1024, precision="fp16-mixed", lora_rank=16, lora_targets="qkvo",
          offload="activations", checkpointing="selective"), True),
    (dict(model="gpt2-medium", batch=1, seq=128, precision="bf16-mixed", lora_rank=16, checkpointing="full"), False),
    (dict(model="bert-base", batch=4, seq=512, precision="fp32", lora_rank=8, lora_targets="all-linear",
          optimizer="adamw8bit", accum=2), True),
    (dict(model="llama-tiny", batch=2, seq=256, precision="bf16", optimizer="adamw8bit", foreach=False), False),
]
SELECTS = ("model", "precision", "optimizer", "checkpointing", "attention", "offload", "zero", "lora_targets")
NUMBERS = ("batch", "seq", "lora_rank", "gpus", "dropout", "accum")


def fill(page, root: str, fields: dict, qlora: bool):
    """Set every control the way a reader would (select options, type numbers, tick boxes)."""
    w = Workload(**fields)
    form = page.locator(f"{root} form")
    if form.locator("details").get_attribute("open") is None:
        form.locator("summary").click()
    for name in SELECTS:
        form.locator(f"select[name={name}]").select_option(str(getattr(w, name)))
    for name in NUMBERS:
        form.locator(f"input[name={name}]").fill(str(getattr(w, name)))
    for name, value in (("foreach", w.foreach), ("inference", w.inference), ("qlora", qlora)):
        form.locator(f"input[name={name}]").set_checked(value)


def shown(page, root: str) -> dict:
    return page.evaluate("""(sel) => {
        const r = document.querySelector(sel);
        return {total: r.getAttribute('data-total-bytes'), error: r.getAttribute('data-error'),
                bytes: Object.fromEntries([...r.querySelectorAll('.vramlab-calc__bar')].map(
                    b => [b.dataset.key, Number(b.dataset.bytes)])),
                cards: Object.fromEntries([...r.querySelectorAll('[data-card-gb]')].map(
                    c => [c.dataset.cardGb, c.dataset.verdict])),
                segments: r.querySelectorAll('.vramlab-calc__stack span').length,
                text: r.querySelector('.vramlab-calc__out').innerText};
    }""", root)


def assert_matches(got: dict, fields: dict, qlora: bool):
    est = estimate(Workload(**fields, qlora=qlora))
    assert got["error"] is None, (fields, got["error"])
    assert int(got["total"]) == est.total_bytes, (fields, got["total"], est.total_bytes)
    assert got["bytes"] == est.breakdown, (fields, got["bytes"], est.breakdown)
    assert got["cards"] == {str(gb): fit_verdict(est.total_bytes, gb) for gb in CARDS_GB}
    assert got["segments"] == sum(1 for v in est.breakdown.values() if v > 0), "one stacked segment per category"
    assert f"{est.params:,}" in got["text"] and f"{est.trainable_params:,}" in got["text"]


# --------------------------------------------------------------------------- calculator

def test_calculator_equals_python_estimate(watch, site_url):  # noqa: F811
    page = watch.page
    page.goto(site_url + "tools/calculator/", wait_until="load")
    root = ".vramlab-calc"
    page.wait_for_selector(f"{root}[data-total-bytes]")
    assert page.locator(root).count() == 1
    labels = page.locator(f"{root} .vramlab-calc__label").all_inner_texts()
    for zh in ("模型", "精度", "优化器", "批大小（micro-batch）", "序列长度", "激活检查点", "LoRA 秩",
               "LoRA 目标模块", "ZeRO 阶段", "GPU 数", "卸载"):
        assert zh in labels, (zh, labels)
    verdicts = set()
    for fields, qlora in CASES:
        fill(page, root, fields, qlora)
        got = shown(page, root)
        assert_matches(got, fields, qlora)
        verdicts |= set(got["cards"].values())
    assert {"fits", "no"} <= verdicts, verdicts
    # the bars are drawn: widths in proportion, the largest category fills its track
    widths = page.evaluate("[...document.querySelectorAll('.vramlab-calc__fill')].map(e => e.style.width)")
    assert "100%" in widths and all(w.endswith("%") for w in widths)
    # an impossible workload: Python and JS refuse it with the same Chinese message
    fill(page, root, dict(model="gpt2-small", batch=8, seq=512), False)
    page.locator(f"{root} input[name=seq]").fill("4096")
    err = shown(page, root)["error"]
    with pytest.raises(WorkloadError) as py_err:
        Workload(model="gpt2-small", seq=4096).validate()
    assert err == str(py_err.value), (err, str(py_err.value))
    assert page.locator(f"{root} [role=alert]").inner_text().startswith("无法估算")
    watch.assert_clean()


def test_calculator_equals_python_on_the_option_grid(watch, site_url):  # noqa: F811
    """estimate.js against vramlab.estimate on every third case of the option grid (vramlab.estimate_grid,
    the 2-layer twins of the sample configs; the planner page loads both estimate.js and the config
    reader that registers them): the same bytes in every category and the same peak moment."""
    from vramlab import estimate_grid as G

    cases = G.covering_cases()[::3]
    sample, want = [], []
    for c in cases:
        w = G.workload(c)
        sample.append({"config": G.model_config(c.model, c.regime, True), "label": w.model[4:], "w": w.to_dict()})
        e = estimate(w)
        want.append({"total": e.total_bytes, "breakdown": e.breakdown, "phase": e.peak_phase})
    page = watch.page
    page.goto(site_url + "tools/plan/", wait_until="load")
    page.wait_for_selector(".vramlab-plan form")
    got = page.evaluate("""(cases) => cases.map(c => {
        VRAMLAB_CALC.presets["cfg:" + c.label] = VramPlan.presetFromConfig(c.config, c.label);
        const w = Object.assign({}, c.w, {model: "cfg:" + c.label});
        const e = VramEstimate.estimate(w);
        return {total: e.total_bytes, breakdown: e.breakdown, phase: e.peak_phase};
    })""", sample)
    assert len(got) == len(want) >= 50
    for c, g, w in zip(cases, got, want):
        assert g == w, (c.label(), g, w)
    watch.assert_clean()


def test_fit_verdict_boundaries(watch, site_url):  # noqa: F811
    page = watch.page
    page.goto(site_url + "tools/calculator/", wait_until="load")
    totals = []
    for gb in CARDS_GB:
        cap = gb * 10**9
        totals += [cap - CONTEXT_RESERVE_BYTES, cap - CONTEXT_RESERVE_BYTES + 1, cap, cap + 1]
    js = page.evaluate("""([totals, cards]) => totals.map(t => cards.map(gb => VramEstimate.fitVerdict(t, gb)))""",
                       [totals, list(CARDS_GB)])
    assert js == [[fit_verdict(t, gb) for gb in CARDS_GB] for t in totals]
    assert {"fits", "tight", "no"} <= {v for row in js for v in row}
    watch.assert_clean()


WIDGETS = {"ch01": "model=gpt2-small", "ch10": "zero=3", "ch19": "optimizer=adamw8bit", "ch24": "lora_rank=16"}


def _marker_fields(chapter: str) -> dict:
    text = (REPO / "docs" / "chapters" / f"{chapter}.md").read_text(encoding="utf-8")
    m = re.findall(r"<!--\s*vramlab:calculator\s+(.*?)-->", text)
    assert len(m) == 1, f"{chapter} should have one calculator marker"
    fields = dict(kv.split("=", 1) for kv in m[0].split())
    types = {f: type(getattr(Workload(), f)) for f in fields}
    return {k: types[k](v) for k, v in fields.items()}


def test_chapter_widgets(watch, site_url):  # noqa: F811
    page = watch.page
    for chapter, hint in WIDGETS.items():
        page.goto(site_url + f"chapters/{chapter}/", wait_until="load")
        page.wait_for_selector(".vramlab-calc[data-compact][data-total-bytes]")
        assert page.locator(".vramlab-calc").count() == 1
        fields = _marker_fields(chapter)
        assert hint.split("=")[0] in fields
        assert_matches(shown(page, ".vramlab-calc"), fields, False)
        link = page.locator("a.vramlab-calc__link")
        assert link.count() == 1 and link.get_attribute("href").endswith("tools/calculator/")
    watch.assert_clean()


# --------------------------------------------------------------------------- timeline viewer

def _committed(name: str) -> dict:
    return json.loads((TRACES / f"{name}.json").read_text(encoding="utf-8"))


def test_timeline_viewer(watch, site_url, tmp_path):  # noqa: F811
    page = watch.page
    page.goto(site_url + "tools/timeline/", wait_until="load")
    index = json.loads((TRACES / "index.json").read_text(encoding="utf-8"))
    root = ".vramlab-timeline"
    page.wait_for_selector(f"{root}[data-trace={index[0]['name']}] svg")
    assert page.locator(f"{root} select[name=trace] option").count() == len(index)
    for entry in index:
        page.locator(f"{root} select[name=trace]").select_option(entry["name"])
        page.wait_for_selector(f"{root}[data-trace={entry['name']}]")
        t = _committed(entry["name"])
        peak = page.locator(f"{root} .vramlab-timeline__peak")
        assert peak.get_attribute("data-op") == t["peak"]["op"]
        assert peak.locator(".vramlab-timeline__op").inner_text() == t["peak"]["op"]
        assert peak.locator(".vramlab-timeline__module").inner_text() == t["peak"]["module"]
        assert "峰值" in peak.inner_text()
        keys = page.eval_on_selector_all(f"{root} svg path.area", "ps => ps.map(p => p.dataset.key)")
        assert keys == t["categories"]
        assert page.locator(f"{root} svg [data-peak]").count() == 1
        assert page.locator(f"{root} svg path.reserved").count() == 1
        assert t["title"] in page.locator(f"{root} h3").inner_text()
        assert page.locator(f"{root} .vramlab-timeline__download").get_attribute("href").endswith(
            f"traces/{entry['name']}.json")
    legend = page.locator(f"{root} .vramlab-timeline__legend").inner_text()
    assert "激活值" in legend and "优化器状态" in legend and "已保留显存" in legend
    # hover: the tooltip shows the point under the mouse
    box = page.locator(f"{root} svg rect.overlay").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    assert page.locator(f"{root} .vramlab-timeline__tip").is_visible()
    assert "已分配" in page.locator(f"{root} .vramlab-timeline__tip").inner_text()
    # zoom with the buttons, reset, then by dragging a range
    full = page.get_attribute(root, "data-view")
    page.locator(f"{root} button", has_text="放大").click()
    assert page.get_attribute(root, "data-view") != full
    page.locator(f"{root} button", has_text="重置缩放").click()
    assert page.get_attribute(root, "data-view") == full
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + 40, steps=5)
    page.mouse.up()
    lo, hi = map(int, page.get_attribute(root, "data-view").split("-"))
    full_hi = int(full.split("-")[1])
    assert 0 < lo < hi < full_hi and hi - lo < full_hi * 0.3, (lo, hi, full)

    # the reader's own file, through the file input
    own = build_trace([Event(1000, "parameters", "empty", "-"), Event(5000, "activations", "mm", "block.0.mlp"),
                       Event(-5000, "activations", "mm", "block.0.mlp")],
                      title="我的时间线", description="", source={"backend": "test"})
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(own, ensure_ascii=False), encoding="utf-8")
    page.locator(f"{root} input[type=file]").set_input_files(str(path))
    page.wait_for_selector(f"{root}[data-trace='file:mine.json']")
    assert page.locator(f"{root} .vramlab-timeline__op").inner_text() == "mm"
    assert page.locator(f"{root} .vramlab-timeline__module").inner_text() == "block.0.mlp"
    assert page.locator(f"{root} h3").inner_text() == "我的时间线"
    # a file that is not a trace: a Chinese message, nothing thrown
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}', encoding="utf-8")
    page.locator(f"{root} input[type=file]").set_input_files(str(bad))
    page.wait_for_selector(f"{root}[data-error]")
    assert "不是 vramlab 时间线文件" in page.locator(f"{root} .vramlab-timeline__status").inner_text()
    watch.assert_clean()


# --------------------------------------------------------------------------- offline build, file://

def test_tools_work_from_file_urls(watch, offline_root):  # noqa: F811
    page = watch.page
    page.goto((offline_root / "tools" / "calculator.html").as_uri(), wait_until="load")
    page.wait_for_selector(".vramlab-calc[data-total-bytes]")
    fields, qlora = CASES[4]
    fill(page, ".vramlab-calc", fields, qlora)
    assert_matches(shown(page, ".vramlab-calc"), fields, qlora)
    page.goto((offline_root / "chapters" / "ch24.html").as_uri(), wait_until="load")
    page.wait_for_selector(".vramlab-calc[data-total-bytes]")
    assert_matches(shown(page, ".vramlab-calc"), _marker_fields("ch24"), False)
    page.goto((offline_root / "tools" / "timeline.html").as_uri(), wait_until="load")
    page.wait_for_selector(".vramlab-timeline[data-trace] svg")
    name = page.get_attribute(".vramlab-timeline", "data-trace")
    assert page.locator(".vramlab-timeline__op").inner_text() == _committed(name)["peak"]["op"]
    page.locator(".vramlab-timeline select[name=trace]").select_option("checkpointing")
    page.wait_for_selector(".vramlab-timeline[data-trace=checkpointing]")
    assert page.locator(".vramlab-timeline__module").inner_text() == _committed("checkpointing")["peak"]["module"]
    assert not [u for u in watch.requests if u.startswith(("http://", "https://"))], \
        "the offline build should not make any http(s) request"
    watch.assert_clean()
