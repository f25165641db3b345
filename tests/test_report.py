"""The learner's feedback (vramlab.grader.memtrace, feedback, report): the bounded timeline a grading
child records, the breakdown / top tensors / per-step growth / SVG figure the report shows, the hint
chosen by what went wrong, and a hidden case's message. No processes: timelines are fed to MemTrace
by hand (a fake device) or recorded in this process on the simulated device; one slow test grades a
real failing ch21 attempt."""
from __future__ import annotations

import re
import textwrap
import types
import xml.etree.ElementTree as ET

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import feedback
from vramlab.grader.memtrace import MAX_BUCKETS, MemTrace
from vramlab.grader.report import figure_of, format_result

MiB = 2 ** 20
CATS = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "cuda_overhead", "other")


# ---- a fake device: the tracker interface MemTrace uses, driven by hand -------------------------------
class _Rec:
    def __init__(self, charged, category, where):
        self.charged, self.category, self.where = charged, category, where


class _Tracker:
    def __init__(self):
        self.allocated = self.peak = 0
        self.peak_where, self.live, self.timeline, self.keep_timeline, self._k = "", {}, None, False, 0

    def alloc(self, n, category="activations", where="transformer.h.0.mlp", op="mm.default"):
        self._k += 1
        self.live[self._k] = _Rec(n, category, where)
        self.allocated += n
        if self.allocated > self.peak:
            self.peak, self.peak_where = self.allocated, f"{op} @ {where}"
        self.timeline.append((self.allocated, 0, f"{op} @ {where}"))
        return self._k

    def free(self, k):
        self.allocated -= self.live.pop(k).charged
        self.timeline.append((self.allocated, 0, "free"))


class _Dev:
    def __init__(self, budget=None):
        self.tracker, self.budget = _Tracker(), budget

    def breakdown(self, at_peak=True):
        out = dict.fromkeys(CATS, 0)
        for r in self.tracker.live.values():
            out[r.category] += r.charged
        return out

    def top_allocations(self, n=10, at_peak=True):
        recs = sorted(self.tracker.live.values(), key=lambda r: -r.charged)[:n]
        return [{"bytes": r.charged, "op": "mm.default", "where": r.where, "category": r.category} for r in recs]

    def current_location(self):
        return "-"

    def phase(self):
        return "forward"

    def out_of_memory(self, request):
        return MemoryError(request)


def _run(steps=4, leak=0, activations=40 * MiB, budget=None, oom_at=None, events_per_step=50):
    """A training-like run on the fake device: parameters before the first call, each call a step
    whose activations rise and fall, `leak` bytes kept per step; returns the payload's memory field."""
    dev = _Dev(budget)
    tr = dev.tracker
    trace = MemTrace(dev, "<submission>")
    try:
        tr.alloc(10 * MiB, "parameters", "GPT2LMHeadModel")
        call = trace.around(lambda f: f())
        for i in range(steps):
            def step(i=i):
                held = [tr.alloc(activations // events_per_step, where=f"transformer.h.{j % 2}.mlp")
                        for j in range(events_per_step)]
                if i == 0:
                    tr.alloc(20 * MiB, "optimizer_state", "optimizer.step")
                if leak:
                    tr.alloc(leak, "activations", "transformer.h.1.mlp.act", op="mul.Tensor")
                if oom_at == i + 1:
                    trace._overflow(8 * MiB)
                    raise MemoryError("card full")
                for k in held:
                    tr.free(k)
            try:
                call(step)
            except MemoryError:
                break
        return trace.summary()
    finally:
        trace.close()


def _view(starter, mine, kind="train_step", warmup=1, card=False):
    spec = types.SimpleNamespace(kind=kind, ci=types.SimpleNamespace(
        warmup=warmup, settings=types.SimpleNamespace(learner_budget_mib=192 if card else None)))
    return feedback.memory_view(spec, "ci", {"memory": starter}, {"memory": mine})


def _result(view, **extra):
    spec = get_exercise(extra.pop("exercise", "ch21-leak"))
    r = {"exercise": spec.id, "kind": spec.kind, "passed": False, "score": 0, "max_score": 10, "category": "too_much_memory",
         "reason": "峰值显存没有降到目标以下", "peak_bytes": 100 * MiB, "baseline_peak_bytes": 200 * MiB, "ratio": 0.9,
         "target_ratio": spec.target_ratio, "correct": True, "backend": "sim", "scale": "ci", "time_ratio": 4.1,
         "step_seconds": 0.5, "max_time_ratio": None, "hints": list(spec.hints), "memory": view}
    r.update(extra)
    return r


# ---- the child's record ------------------------------------------------------------------------------
def test_memtrace_is_bounded_and_exact_at_calls():
    mem = _run(steps=5, events_per_step=3000)             # 30 000 events
    assert mem["events"] == 5 * (2 * 3000 + 0) + 1        # the optimizer state's allocation in step 1
    assert len(mem["points"]) <= 2 * MAX_BUCKETS + 3 * 5
    peaks = [c[4] for c in mem["calls"]]
    # the latest call that reached the peak: the measured steps come after the warm-up
    assert max(peaks) == mem["peak"] and mem["peak_call"] == len(peaks) - 1 - peaks[::-1].index(max(peaks))
    assert [c[6] for c in mem["calls"]] == [1] * 5                     # all finished
    assert [c[8] for c in mem["calls"]] == [0] * 5                     # nothing carried from step to step
    assert feedback.claim({"memory": mem}) is mem


def test_memtrace_counts_what_each_step_leaves_behind():
    mem = _run(steps=4, leak=4 * MiB)
    assert [c[8] for c in mem["calls"]] == [4 * MiB, 8 * MiB, 12 * MiB, 16 * MiB]
    ends = [c[3] for c in mem["calls"]]
    assert all(b - a == 4 * MiB for a, b in zip(ends[1:], ends[2:]))


def test_malformed_claims_are_dropped_not_judged():
    good = _run(steps=2)
    for bad in ({"memory": "x"}, {"memory": dict(good, points=[[1, -5]])}, {"memory": dict(good, calls=[[1, 2]])},
                {"memory": dict(good, top=[{"bytes": 1}])}, {"memory": dict(good, peak_call=7)},
                {"memory": dict(good, points=[[i, 1] for i in range(100_000)])}, None, {}):
        assert feedback.claim(bad) is None
    view = _view(good, {"oops": 1})
    assert view["mine"] is None and view["starter"] is not None
    assert feedback.memory_view(get_exercise("ch01-estimate"), "ci", {"memory": good}, {"memory": good}) is None


def test_overflow_on_the_simulated_device_names_step_operator_and_line():
    """In this process: a leaking train_step compiled as the learner's file on a small card; the
    record names the call that overflowed, the aten operator, and the learner's line and code."""
    torch = pytest.importorskip("torch")
    from vramlab.grader.guards import LEARNER_FILE
    from vramlab.models import build_model
    from vramlab.sim.device import SimDevice

    source = textwrap.dedent('''\
        kept = []
        def train_step(model, optimizer, batch):
            out = model(input_ids=batch, labels=batch)
            kept.append(out.logits * 2)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return out.loss.item()
        ''')
    ns: dict = {}
    exec(compile(source, LEARNER_FILE, "exec"), ns)
    dev = SimDevice(timeline=False, cublas_workspace=False)
    with dev:
        torch.manual_seed(0)
        model = build_model("tiny")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = torch.randint(0, 100, (2, 32))
        trace = MemTrace(dev, LEARNER_FILE)
        trace.source_lines = source.splitlines()          # what the harness sets from the submission
        call = trace.around(lambda f: f())
        try:
            call(lambda: ns["train_step"](model, optimizer, batch))
            dev.set_budget(dev.max_allocated() + 2 * MiB)
            with pytest.raises(torch.OutOfMemoryError):
                for _ in range(20):
                    call(lambda: ns["train_step"](model, optimizer, batch))
            mem = trace.summary()
        finally:
            trace.close()
    oom = mem["oom"]
    assert oom["call"] >= 2 and oom["capacity"] == dev.budget and oom["op"]
    assert oom["line"] in (3, 4, 5) and oom["function"] == "train_step"
    assert oom["code"] == source.splitlines()[oom["line"] - 1].strip()
    carried = [c[8] for c in mem["calls"] if c[6]]
    assert carried == sorted(carried) and carried[-1] > carried[0] > 0       # the kept logits, step after step
    assert feedback.claim({"memory": mem}) is not None


# ---- the report ------------------------------------------------------------------------------------------
def test_report_breakdown_top_tensors_and_growth():
    view = _view(_run(steps=5, leak=6 * MiB), _run(steps=5, leak=2 * MiB), card=True)
    text = format_result(_result(view))
    assert "显存花在了哪里" in text and "激活值" in text and "优化器状态" in text
    assert "模块 transformer.h.1.mlp.act" in text                      # the top tensors, named by module
    steps = text.split("每步结束时的已分配显存", 1)[1].split("先想一想", 1)[0]
    assert steps.count("在涨") == 2 and "每步多留下约 6.00 MiB" in steps and "每步多留下约 2.00 MiB" in steps
    assert "单步耗时" not in text                                        # unjudged step time: not shown
    assert "还有一处泄漏" in text and get_exercise("ch21-leak").hints[2] in text


def test_report_passed_is_short_and_flat_steps_are_not_listed():
    view = _view(_run(steps=2), _run(steps=2, activations=20 * MiB))
    text = format_result(_result(view, exercise="ch07-checkpoint", passed=True, score=10, category="ok", reason="通过"))
    assert "显存花在了哪里" in text and "最大的张量" not in text and "每步结束时" not in text and "先想一想" not in text


def test_figure_is_svg_with_both_runs_peaks_card_and_overflow():
    view = _view(_run(steps=5, leak=6 * MiB), _run(steps=5, leak=30 * MiB, budget=200 * MiB, oom_at=3), card=True)
    svg = figure_of(_result(view))
    root = ET.fromstring(svg)                                         # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2
    texts = " ".join(t.text or "" for t in root.iter(f"{ns}text"))
    assert "起始代码峰值" in texts and "你的显卡 200.00 MiB" in texts and "OOM（第 3 步）" in texts
    assert "第 1 步（预热）" in texts and "第 5 步" in texts
    assert len(root.findall(f"{ns}circle")) == 5 + 2                   # step ends: 5 of the starter, 2 of yours


def test_hidden_figure_and_lines_show_no_bytes():
    view = feedback.normalised(_view(_run(steps=3, leak=6 * MiB), _run(steps=3, leak=3 * MiB, oom_at=3), card=True))
    r = _result(None, hidden_failed=1, hidden_memory=view, category="oom")
    text, svg = format_result(r), figure_of(r)
    assert "MiB" not in svg and "起始代码峰值 = 100%" in svg
    section = text.split("下面是隐藏配置", 1)[1]
    assert "MiB" not in section and "KiB" not in section and "%" in section
    # the starter's run is cut where yours ended: the hidden number of steps is not drawn
    assert view["starter"]["calls"] == view["mine"]["calls"] == 3 and "第 3 步" in svg
    longer = feedback.normalised(_view(_run(steps=6, leak=6 * MiB), _run(steps=6, leak=3 * MiB, oom_at=3)))
    assert longer["starter"]["calls"] == 3 and "第 4 步" not in figure_of(_result(None, hidden_failed=1, hidden_memory=longer))


# ---- the hint that fits ---------------------------------------------------------------------------------
@pytest.mark.parametrize("exercise, category, reason, leak, index", [
    ("ch05-accumulation", "incorrect", "返回的损失与起始代码不同", None, 1),          # weighting by rows
    ("ch05-accumulation", "too_much_memory", "", "leak", 2),                          # graph kept in a list
    ("ch21-leak", "oom", "", "leak", 1),
    ("ch21-leak", "oom", "", "leak_partial", 2),                                       # "泄漏不止一处"
    ("ch21-leak", "too_much_memory", "", None, 0),
    ("ch07-checkpoint", "too_much_memory", "", None, 0),
    ("ch07-checkpoint", "technique", "检测到了重算，但反向开始时 block 的前向留在设备上的张量仍有起始代码的 83%", None, 2),
    ("ch07-checkpoint", "technique", "反向过程中没有检测到 block 内的模块被重新执行", None, 1),
    ("ch06-mixed-precision", "technique", "没有在 autocast 下前向", None, 1),
    ("ch23-distill", "incorrect", "", None, 2),                                       # teacher in eval mode
    ("ch07-checkpoint", "exception", "RuntimeError", None, 0),
])
def test_hint_chosen_by_what_went_wrong(monkeypatch, exercise, category, reason, leak, index):
    monkeypatch.setattr(feedback, "leak_class", lambda view: leak)
    spec = get_exercise(exercise)
    r = {"passed": False, "hints": list(spec.hints), "category": category, "reason": reason, "ratio": 1.0}
    i, why = feedback.choose_hint(r)
    assert i == index, (i, why)
    assert i < len(spec.hints) - 1                      # never the last one (the answer)


def test_no_hint_for_tampering_or_a_pass():
    hints = list(get_exercise("ch05-accumulation").hints)
    assert feedback.choose_hint({"passed": False, "hints": hints, "category": "tamper"}) is None
    assert feedback.choose_hint({"passed": True, "hints": hints, "category": "ok"}) is None


def test_every_spec_gets_a_hint_for_every_class():
    from vramlab.exercises import EXERCISES

    for spec in EXERCISES.values():
        for category in ("too_much_memory", "oom", "incorrect", "technique", "exception", "too_many_trials"):
            got = feedback.choose_hint({"passed": False, "hints": list(spec.hints), "category": category})
            assert got is not None and 0 <= got[0] <= max(0, len(spec.hints) - 2), (spec.id, category, got)


# ---- a hidden case's message --------------------------------------------------------------------------------
def _hidden_oom_case():
    view = _view(_run(steps=4, leak=6 * MiB), _run(steps=4, leak=30 * MiB, budget=170 * MiB, oom_at=3), card=True)
    view["mine"]["oom"].update(op="_log_softmax.default", module="-", line=9, function="train_step",
                               code="logp = torch.log_softmax(out.logits, dim=-1)")
    return {"category": "oom", "reason": "内存/显存不足：OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 MiB.",
            "memory": view, "ratio": None, "target_ratio": 0.8}


def test_hidden_oom_message_names_dimensions_step_operator_line_without_values():
    variation = get_exercise("ch21-leak").ci.hidden[0]
    msg = feedback.hidden_failure_reason(_hidden_oom_case(), variation.changes_zh(), 1, 1)
    assert variation.changes_zh() + "变了" in msg and "具体数值不公开" in msg
    assert "第 3 步显存溢出（前面 2 步都放得下）" in msg
    assert "_log_softmax" in msg and "你的函数里（模型的模块之外）" in msg
    assert "（train_step 里）这一行：`logp = torch.log_softmax(out.logits, dim=-1)`" in msg
    assert "…" not in msg and "发生在 -" not in msg and "MiB" not in msg
    assert not re.search(r"[A-Za-z]{3,} [a-z]{3,} [a-z]{3,}", msg.replace("torch.log_softmax(out.logits", ""))  # no English sentence
    assert "只对题目给出的形状或数字成立" not in msg and "在涨" in msg    # the cause is a leak, not a shape


def test_hidden_over_target_and_incorrect_messages():
    over = {"category": "too_much_memory", "reason": "峰值显存没有降到目标以下：峰值 97.00 MiB …", "ratio": 0.9,
            "target_ratio": 0.85, "memory": None}
    msg = feedback.hidden_failure_reason(over, "层数", 1, 1)
    assert "0.90 倍" in msg and "超出目标 6%" in msg and "MiB" not in msg and "层数变了" in msg
    wrong = {"category": "incorrect", "reason": "结果与起始代码不一致：返回的损失与起始代码不同（起始代码 ['9.08123']）",
             "loss_max_rel_err": 0.031, "update_rel_err": 0.2, "memory": None}
    msg = feedback.hidden_failure_reason(wrong, "批大小", 1, 2)
    assert "损失的最大相对误差 0.031" in msg and "9.08" not in msg and msg.endswith("你的写法是不是只对题目给出的形状或数字成立？")
    crash = {"category": "exception", "reason": "代码运行出错：RuntimeError: shape '[4, 4, 128]' is invalid for input of size 1536"}
    msg = feedback.hidden_failure_reason(crash, "批大小", 1, 1)
    assert "128" not in msg and "1536" not in msg and "…" not in msg


def test_visible_oom_reason_is_chinese_with_location():
    view = _hidden_oom_case()["memory"]
    r = feedback.explain({"category": "oom", "reason": "内存/显存不足：OutOfMemoryError: CUDA out of memory. ...", "memory": view})
    assert r["reason"].startswith("内存/显存不足：第 3 步显存溢出") and "170.00 MiB 的显卡" in r["reason"]
    assert "CUDA out of memory" not in r["reason"] and "这一行：`logp = " in r["reason"]
    cuda = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 GiB of "
            "which 3.94 MiB is free. Of the allocated memory 78.50 GiB is allocated by PyTorch, and 12.3 MiB is reserved by "
            "PyTorch but unallocated.")
    r = feedback.explain({"category": "oom", "reason": cuda, "memory": None})
    assert "CUDA 显存不足：要申请 20.00 MiB，GPU 0 总容量 79.19 GiB，空闲 3.94 MiB" in r["reason"]
    assert "Tried" not in r["reason"]


# ---- a real grading ----------------------------------------------------------------------------------------
ONE_LEAK_LEFT = '''\
import torch


def train_step(model, optimizer, batch, device):
    mon = _monitor(model)
    out = model(input_ids=batch, labels=batch)
    with torch.no_grad():
        logp = torch.log_softmax(out.logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1).mean()
    mon["entropy_sum"] += entropy.item()
    mon["steps"] += 1
    del logp, entropy
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()


def _monitor(model):
    if not hasattr(model, "_monitor"):
        mon = {"mlp_act": [], "entropy_sum": 0.0, "steps": 0}

        def record(module, args, output):
            mon["mlp_act"].append(output.abs().mean())      # the leak left: the hook keeps the graph

        for block in model.transformer.h:
            block.mlp.act.register_forward_hook(record)
        model._monitor = mon
    return model._monitor
'''


@pytest.mark.slow
def test_graded_ch21_with_one_leak_left_reports_the_per_step_growth():
    from vramlab.grader import grade_source

    r = grade_source("ch21-leak", ONE_LEAK_LEFT)
    assert not r["passed"]
    text = format_result(r)
    assert "每步结束时的已分配显存" in text and "在涨" in text, text
    assert "泄漏不止一处" in text                                        # the hint for a leak half fixed
    assert "…" not in r["reason"] and "发生在 -" not in r["reason"]
    assert figure_of(r) is not None and "OOM" in figure_of(r)
