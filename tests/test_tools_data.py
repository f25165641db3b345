"""The data behind the site's tools, without a browser: the calculator's generated presets file,
the trace format and its downsampling, the CUDA-snapshot converter, the `vramlab trace` command,
and the build hooks' checks of their markers. (tests/test_tools_browser.py runs the tools themselves.)
"""
from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import pytest

from vramlab import webdata
from vramlab.trace.cuda import from_snapshot
from vramlab.trace.format import MAX_POINTS, Event, build_trace, check_trace

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "docs" / "assets" / "traces"


def test_presets_js_is_up_to_date():
    assert webdata.OUT.read_text(encoding="utf-8") == webdata.render(), \
        "docs/assets/calculator/presets.js is stale: run python -m vramlab.webdata"
    assert webdata.main(["--check"]) == 0


def test_fit_verdict_units():
    # nominal decimal GB; the CUDA context's share decides "tight"
    assert webdata.fit_verdict(24 * 10**9 - webdata.CONTEXT_RESERVE_BYTES, 24) == "fits"
    assert webdata.fit_verdict(24 * 10**9, 24) == "tight"
    assert webdata.fit_verdict(24 * 2**30, 24) == "no"          # 24 GiB does not fit a 24 GB card


def test_tool_scripts_stay_on_this_machine():
    for js in (REPO / "docs" / "assets").glob("*/*.js"):
        if js.parent.name in ("calculator", "timeline"):
            text = js.read_text(encoding="utf-8")
            assert "https://" not in text and "fetch(" not in text, js
            assert text.count("http://") == text.count("http://www.w3.org/2000/svg"), js


def test_committed_traces():
    index = json.loads((TRACES / "index.json").read_text(encoding="utf-8"))
    assert len(index) >= 3
    total = 0
    for entry in index:
        path = TRACES / entry["file"]
        total += path.stat().st_size
        t = json.loads(path.read_text(encoding="utf-8"))
        check_trace(t)
        assert t["title"] == entry["title"]
        assert len(t["points"]["x"]) <= MAX_POINTS + 16
        assert t["peak"]["bytes"] == t["source"]["max_allocated"], "the trace's peak is the device's peak"
        assert t["peak"]["bytes"] == max(t["points"]["allocated"]), "downsampling keeps the peak"
        assert t["peak"]["op"] and t["peak"]["module"]
        assert {"parameters", "optimizer_state", "activations"} <= set(t["categories"])
        assert sum(t["peak"]["breakdown"].values()) == t["peak"]["bytes"]
    assert total < 400_000, f"traces should stay small, are {total:,} bytes"


def test_build_trace_downsamples_and_keeps_the_peak():
    events = [Event(512 * (1 + i % 7), "activations", "mm", f"h.{i % 12}") for i in range(3000)]
    events += [Event(-512 * (1 + i % 7), "activations", "mm", f"h.{i % 12}") for i in range(3000)]
    events.insert(2000, Event(10**9, "temporaries", "big", "spike"))
    events.insert(2001, Event(-10**9, "temporaries", "big", "spike"))
    t = build_trace(events, title="t", description="", source={}, initial={"parameters": 4096}, marks=[(17, "m")])
    check_trace(t)
    assert len(t["points"]["x"]) <= MAX_POINTS
    assert t["peak"]["op"] == "big" and t["peak"]["module"] == "spike" and t["peak"]["x"] == 2000
    assert t["peak"]["x"] in t["points"]["x"] and 17 in t["points"]["x"]
    assert t["categories"] == ["parameters", "activations", "temporaries"]
    assert t["points"]["reserved"] is None


def _snapshot() -> dict:
    """A small snapshot in the layout documented in torch/cuda/memory.py (_snapshot)."""
    frames = [{"filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
              {"filename": "/home/me/train.py", "line": 42, "name": "train_step"}]
    trace = [{"action": "segment_alloc", "addr": 0, "size": 2 << 20, "frames": []},
             {"action": "alloc", "addr": 0, "size": 1 << 20, "frames": frames[:1]},
             {"action": "alloc", "addr": 1 << 20, "size": 512 << 10, "frames": frames},
             {"action": "free_requested", "addr": 0, "size": 1 << 20, "frames": []},
             {"action": "free_completed", "addr": 0, "size": 1 << 20, "frames": []},
             {"action": "free_completed", "addr": 99 << 20, "size": 256 << 10, "frames": []}]
    segments = [{"device": 0, "address": 0, "total_size": 2 << 20,
                 "blocks": [{"size": 512 << 10, "state": "active_allocated"}, {"size": 1536 << 10, "state": "inactive"}]},
                {"device": 0, "address": 99 << 20, "total_size": 2 << 20,
                 "blocks": [{"size": 1 << 20, "state": "active_allocated"}]}]
    return {"segments": segments, "device_traces": [trace]}


def test_cuda_snapshot_conversion():
    t = from_snapshot(_snapshot())
    check_trace(t)
    before = (512 << 10) + (1 << 20) - ((1 << 20) + (512 << 10) - (1 << 20) - (256 << 10))
    assert t["peak"]["bytes"] == before + (1 << 20) + (512 << 10)
    assert t["peak"]["op"] == "train_step" and t["peak"]["module"] == "train.py:42"   # first frame outside torch
    assert t["points"]["allocated"][-1] == (512 << 10) + (1 << 20)                      # what the segments hold
    assert t["points"]["by_category"]["before_trace"][-1] == before - (256 << 10)
    assert t["points"]["reserved"][-1] == 4 << 20
    assert t["source"]["backend"] == "cuda"


def test_cli_trace(tmp_path, capsys):
    from vramlab.cli import main

    snap = tmp_path / "snapshot.pickle"
    snap.write_bytes(pickle.dumps(_snapshot()))
    out = tmp_path / "cuda.json"
    assert main(["trace", "--from-cuda-snapshot", str(snap), "--out", str(out)]) == 0
    check_trace(json.loads(out.read_text(encoding="utf-8")))
    out = tmp_path / "sim.json"
    assert main(["trace", "--model", "tiny", "--batch", "2", "--seq", "32", "--steps", "1", "--out", str(out)]) == 0
    t = json.loads(out.read_text(encoding="utf-8"))
    check_trace(t)
    assert t["peak"]["bytes"] == t["source"]["max_allocated"]
    assert "已写入" in capsys.readouterr().out
    assert main(["trace", "--model", "tiny", "--zero", "2", "--gpus", "2", "--out", str(out)]) == 2


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"hook_{name}", REPO / "docs" / "hooks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_calculator_marker_is_checked_at_build_time():
    from mkdocs.exceptions import PluginError

    hook = _hook("calculator")
    html = hook.calculator_html(" model=llama-7b zero=3 gpus=8 precision=bf16-mixed ", "chapters/ch10.md")
    assert 'data-w-model="llama-7b"' in html and "data-compact" in html and "(../tools/calculator.md)" in html
    assert "data-compact" not in hook.calculator_html(" full ", "tools/calculator.md")
    for bad in (" modle=tiny ", " zero=2 ", " model=gpt2-small seq=4096 ", " fast "):
        with pytest.raises(PluginError):
            hook.calculator_html(bad, "chapters/ch01.md")
