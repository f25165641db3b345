"""Exercise kinds (vramlab.grader.kinds) without child processes: the registry and its contract,
typed settings, the payload checks, every judge on hand-made payloads (truths from the trusted
run, malformed learner payloads -> "tamper"), and the technique probe on a small model in-process."""
from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path

import pytest

from vramlab.exercises import EXERCISES, get_exercise
from vramlab.exercises.spec import criteria_zh
from vramlab.grader import core
from vramlab.grader.kinds import CONTRACT, KINDS, get_kind, settings_from, technique
from vramlab.grader.kinds.common import (BOOL, INT, NUM, STR, CommonSettings, explicit, list_of,
                                         malformed, optional, pair, record)


def result_for(spec) -> dict:
    return core.base_result(spec, "sim", "ci")


# ---- registry and contract ---------------------------------------------------------------------------
def test_every_spec_kind_is_registered_and_every_kind_is_used():
    assert {s.kind for s in EXERCISES.values()} == set(KINDS)
    with pytest.raises(KeyError, match="unknown exercise kind"):
        get_kind("nope")


@pytest.mark.parametrize("name", list(KINDS))
def test_kind_module_exports_the_contract(name):
    kind = KINDS[name]
    for attr in CONTRACT:
        assert hasattr(kind, attr), f"{name} lacks {attr}"
    assert dataclasses.is_dataclass(kind.Settings) and issubclass(kind.Settings, CommonSettings)
    assert kind.Settings.__dataclass_params__.frozen
    assert isinstance(kind.PERMISSIONS, frozenset) and isinstance(kind.OBSERVED, bool)
    for fn in ("permissions", "observed", "scenario", "judge", "criteria_zh"):
        assert callable(getattr(kind, fn))


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_spec_settings_are_the_kinds_and_survive_the_job(exercise_id):
    spec = get_exercise(exercise_id)
    kind = get_kind(spec.kind)
    for scale in ("ci", "gpu"):
        settings = getattr(spec, scale).settings
        assert type(settings) is kind.Settings
        job = json.loads(json.dumps(core.make_job(spec, scale, "sim").to_dict()))
        assert "extra" not in job and settings_from(spec.kind, job["settings"]) == settings
        assert job["world_size"] == settings.world_size and job["config"] == settings.config
        perms = kind.permissions(settings)
        assert isinstance(perms, frozenset) and ("host" in perms) == settings.allow_host
        assert kind.observed(settings) is (spec.kind not in ("estimate", "max_batch") and not settings.allow_host)
    assert criteria_zh(spec) and all(isinstance(line, str) and line.startswith("- ") for line in criteria_zh(spec))


def test_monitor_may_reset_the_peak_and_nothing_else_may():
    assert get_kind("monitor").permissions(get_exercise("ch02-monitor").ci.settings) == {"reset_peak"}
    assert get_kind("train_step").permissions(get_exercise("ch05-accumulation").ci.settings) == frozenset()


# ---- settings -------------------------------------------------------------------------------------------
def test_unknown_setting_is_refused_with_the_known_ones():
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['micro_bach'\].*learner_budget_mib"):
        get_kind("train_step").Settings(micro_bach=4)


@pytest.mark.parametrize("kind, kwargs, match", [
    ("train_step", {"world_size": "2"}, "world_size"),
    ("train_step", {"world_size": True}, "world_size"),
    ("train_step", {"config": [("n_layer", 2)]}, "config"),
    ("estimate", {"cases": [("tiny", "adamw", "fp32")]}, "cases"),
    ("call", {"case": "nope"}, "unknown case"),
    ("call", {"case": "tp_mlp"}, "needs"),
    ("call", {"case": "tp_mlp", "d_model": 8, "heads": 2}, "does not read"),
    ("finetune", {"method": "lora2", "same_start": True, "max_trainable_share": 0.1}, "unknown"),
])
def test_settings_check_types_and_case_knobs(kind, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        get_kind(kind).Settings(**kwargs)


def test_settings_accept_json_lists_and_show_only_what_a_spec_chose():
    s = get_kind("estimate").Settings(cases=[["tiny", "sgd", "fp32", False]], visible=1)
    assert s.cases == (("tiny", "sgd", "fp32", False),)
    assert explicit(s) == {"cases": (("tiny", "sgd", "fp32", False),), "visible": 1}
    assert explicit(get_kind("train_step").Settings(world_size=2)) == {"world_size": 2}
    assert get_kind("finetune").Settings(method="lora", same_start=False, max_trainable_share=0.1).same_start is False


def test_a_spec_with_the_wrong_settings_class_fails_when_built():
    spec = get_exercise("ch05-accumulation")
    wrong = dataclasses.replace(spec.ci, settings=get_kind("call").Settings(case="eval_loop", n_batches=2))
    with pytest.raises(TypeError, match="train_step.Settings"):
        dataclasses.replace(spec, ci=wrong)
    with pytest.raises(ValueError, match="technique"):
        dataclasses.replace(spec, technique="telepathy")


# ---- payload checks --------------------------------------------------------------------------------------
def test_malformed_names_the_field_and_allows_what_the_harness_writes():
    fields = dict(peak=INT, losses=list_of(NUM), name=STR, ok=BOOL, trials=list_of(pair(INT, BOOL)),
                  extra=optional(record(n=INT)))
    good = {"peak": 5, "losses": [1.0, math.nan, math.inf, 2], "name": "x", "ok": True, "trials": [[1, True]]}
    assert malformed(good, **fields) is None
    assert malformed(dict(good, extra=None), **fields) is None
    cases = [
        ({k: v for k, v in good.items() if k != "peak"}, "缺少字段 peak"),
        (dict(good, peak=True), "peak 应当是非负整数"),
        (dict(good, peak=-1), "peak 应当是非负整数"),
        (dict(good, peak=2 ** 70), "peak 应当是非负整数"),
        (dict(good, losses=[1.0, "2"]), r"losses\[1\] 应当是数"),
        (dict(good, losses=[0.0] * 200_000), "losses 太长"),
        (dict(good, losses={"a": 1}), "losses 应当是列表"),
        (dict(good, trials=[[1, 1]]), r"trials\[0\]\[1\]"),
        (dict(good, extra={"n": "x"}), r"extra\.n 应当是非负整数"),
    ]
    for payload, match in cases:
        why = malformed(payload, **fields)
        assert why and why.startswith("结果文件的格式不对：")
        assert __import__("re").search(match, why), (match, why)
    assert "应当是字典" in malformed([1, 2], **fields)
    assert "应当是字典" in malformed(None, **fields)


# ---- judges -------------------------------------------------------------------------------------------
def training_payload(losses=(6.0, 5.5, 5.0), update=(1.0, -2.0, 0.5), peak=80 * 2 ** 20, probe=None, **more):
    p = {"ok": True, "peak_bytes": peak, "losses": list(losses), "update": list(update), "param_count": 1000,
         "step_seconds": 0.1, "static_bytes": 10 * 2 ** 20, "breakdown": {}}
    if probe is not None:
        p["technique"] = probe
    p.update(more)
    return p


def probe_report(passes=(64,), matmuls=16, low=0, recomputed=0, saved=1000, outside=100, open_rows=0,
                 dtype="torch.float32", steps=3):
    return {"steps": [{"passes": list(passes), "open_rows": open_rows, "block_matmuls": matmuls,
                       "block_matmuls_low": low, "recomputed": recomputed, "transitions": len(passes) or 1,
                       "saved_total": saved, "saved_outside": outside} for _ in range(steps)],
            "blocks": 6, "autocast_dtypes": ["torch.bfloat16"] if low else [],
            "dtypes": {"parameters": [dtype], "gradients": [dtype], "optimizer_state": [dtype]},
            "final_parameter_dtypes": [dtype]}


def judge(exercise_id, bp, sp):
    spec = get_exercise(exercise_id)
    return core.judge(get_kind(spec.kind), spec, result_for(spec), bp, sp)


def test_training_judge_passes_fails_and_refuses_malformed():
    bp = training_payload(peak=100 * 2 ** 20, probe=probe_report())
    four = probe_report(passes=(16, 16, 16, 16))
    ok = judge("ch05-accumulation", bp, training_payload(peak=60 * 2 ** 20, probe=four))
    assert ok["passed"] and ok["category"] == "ok" and ok["ratio"] == 0.6
    assert judge("ch05-accumulation", bp, training_payload(peak=90 * 2 ** 20, probe=four))["category"] == "too_much_memory"
    one = judge("ch05-accumulation", bp, training_payload(peak=60 * 2 ** 20, probe=probe_report()))
    assert one["category"] == "technique" and "[1, 1, 1]" in one["reason"]
    wrong = judge("ch05-accumulation", bp, training_payload(losses=(6.0, 5.0, 4.0), probe=four))
    assert wrong["category"] == "incorrect"
    below = judge("ch05-accumulation", bp, training_payload(peak=2 ** 20, probe=four))
    assert below["category"] == "tamper"
    for forged in [training_payload(peak="big"), training_payload(losses=[0.0] * 200_000), {"ok": True}, [1, 2],
                   training_payload(probe=four | {"steps": "many"}),
                   training_payload(update=[{"x": 1}])]:
        r = judge("ch05-accumulation", bp, forged)
        assert r["category"] == "tamper" and "结果文件的格式不对" in r["reason"], r["reason"]


def test_accumulation_needs_micro_batches_each_forward_then_backward():
    bp = training_payload(peak=100 * 2 ** 20, probe=probe_report())
    for passes, open_rows, says in [((60, 4), 0, "94%"),            # one row split off a checkpointed batch
                                    ((64,), 16, "[1, 1, 1]"),        # a whole-batch pass and an extra forward
                                    ((16, 16), 0, "只有 32 个"),      # half the batch never trained
                                    ((16, 16, 16, 16), 64, "100%")]:  # and a whole-batch forward never backpropagated
        r = judge("ch05-accumulation", bp, training_payload(peak=60 * 2 ** 20, probe=probe_report(passes, open_rows=open_rows)))
        assert r["category"] == "technique" and says in r["reason"], (passes, r["reason"])
    uneven = judge("ch05-accumulation", bp, training_payload(peak=60 * 2 ** 20, probe=probe_report((48, 16))))
    assert uneven["passed"], uneven["reason"]


def test_checkpoint_technique_needs_recomputation_and_little_left_by_the_blocks():
    bp = training_payload(peak=100 * 2 ** 20, probe=probe_report(saved=15_000_000, outside=1_000_000))
    ok = judge("ch07-checkpoint", bp, training_payload(peak=50 * 2 ** 20,
                                                       probe=probe_report(recomputed=40, saved=2_000_000, outside=1_000_000)))
    assert ok["passed"], ok["reason"]
    none = judge("ch07-checkpoint", bp, training_payload(peak=50 * 2 ** 20, probe=probe_report((32, 32))))
    assert none["category"] == "technique" and "没有检测到" in none["reason"]
    fake = judge("ch07-checkpoint", bp, training_payload(
        peak=50 * 2 ** 20, probe=probe_report(recomputed=24, saved=15_000_000, outside=1_000_000)))
    assert fake["category"] == "technique" and "100%" in fake["reason"]
    # bytes claimed to be outside the blocks count as the blocks' beyond what the starter keeps outside
    claimed = judge("ch07-checkpoint", bp, training_payload(
        peak=50 * 2 ** 20, probe=probe_report(recomputed=24, saved=15_000_000, outside=14_000_000)))
    assert claimed["category"] == "technique" and "100%" in claimed["reason"]


def test_autocast_technique_needs_16_bit_block_matmuls_and_fp32_master_state():
    bp = training_payload(peak=100 * 2 ** 20, probe=probe_report())
    ok = judge("ch06-mixed-precision", bp, training_payload(peak=70 * 2 ** 20, probe=probe_report(low=16)))
    assert ok["passed"], ok["reason"]
    pure = judge("ch06-mixed-precision", bp,
                 training_payload(peak=70 * 2 ** 20, probe=probe_report(low=16, dtype="torch.bfloat16")))
    assert pure["category"] == "technique" and "torch.bfloat16" in pure["reason"] and "float32" in pure["reason"]
    off = judge("ch06-mixed-precision", bp, training_payload(peak=70 * 2 ** 20, probe=probe_report()))
    assert off["category"] == "technique" and "16 位" in off["reason"]
    # 16-bit matmuls the probe saw, but fewer than one forward of the blocks has: the rest went unseen
    few = judge("ch06-mixed-precision", bp, training_payload(peak=70 * 2 ** 20, probe=probe_report(matmuls=2, low=2)))
    assert few["category"] == "technique" and "[16, 16, 16]" in few["reason"]


def test_monitor_truths_come_from_the_trusted_run():
    names = ["transient", "keeps_output", "train_step"]
    bp = {"answers": [{"case": n, "truth": t, "got": 1.0} for n, t in zip(names, (100, 200, 300))], "peak_bytes": 300}

    def sp(truths, gots):
        return {"answers": [{"case": n, "truth": t, "got": g} for n, t, g in zip(names, truths, gots)]}
    assert judge("ch02-monitor", bp, sp((100, 200, 300), (100, 200, 300)))["passed"]
    # the learner's process claims other truths and answers them: judged against the trusted ones
    claimed = judge("ch02-monitor", bp, sp((150, 250, 350), (150, 250, 350)))
    assert claimed["category"] == "incorrect" and claimed["baseline_peak_bytes"] in (100, 200, 300)
    assert judge("ch02-monitor", bp, sp((50, 100, 150), (50, 100, 150)))["category"] == "tamper"
    assert judge("ch02-monitor", bp, {"answers": sp((100, 200, 300), (100, 200, 300))["answers"][::-1]})[
        "category"] == "tamper"
    assert judge("ch02-monitor", bp, {"answers": [{"case": "transient", "truth": "x", "got": 1}]})["category"] == "tamper"


def linear_trials(answer):
    return [[n, True] for n in range(2, answer + 1)] + [[answer + 1, False]]


def test_max_batch_answer_is_the_trusted_starters():
    bp = {"answer": 20, "verified": True, "trials": linear_trials(20), "peak_bytes": 1}
    good = {"answer": 20, "verified": True, "trials": [[1, True], [2, True], [4, True], [8, True], [16, True],
                                                       [32, False], [24, False], [20, True], [22, False],
                                                       [21, False]], "peak_bytes": 1}
    assert judge("ch13-max-batch", bp, good)["passed"]
    claimed = judge("ch13-max-batch", bp, dict(good, answer=22))        # "verified" in its own process: a claim
    assert claimed["category"] == "incorrect" and "22" in claimed["reason"]
    many = judge("ch13-max-batch", bp, dict(good, trials=linear_trials(20)))
    assert many["category"] == "too_many_trials"
    assert judge("ch13-max-batch", bp, dict(good, trials=[[1, "yes"]]))["category"] == "tamper"
    for broken in [dict(bp, verified=False), dict(bp, trials=linear_trials(19)), dict(bp, answer=None)]:
        with pytest.raises(core.GraderError):
            judge("ch13-max-batch", broken, good)


def test_estimate_truths_come_from_the_trusted_run():
    spec = get_exercise("ch01-estimate")
    n = len(spec.ci.settings.cases)
    bp = {"cases": [[1000, "adamw", "fp32"]] * n, "truths": [16000] * n}
    assert judge("ch01-estimate", bp, {"answers": [16000.0] * n, "truths": [1] * n})["passed"]
    off = judge("ch01-estimate", bp, {"answers": [8000.0] * n})
    assert off["category"] == "incorrect" and "50.0%" in off["reason"]
    assert judge("ch01-estimate", bp, {"answers": [math.nan] * n})["category"] == "incorrect"
    assert judge("ch01-estimate", bp, {"answers": ["16000"] * n})["category"] == "tamper"
    with pytest.raises(core.GraderError):
        judge("ch01-estimate", {"cases": bp["cases"], "truths": None}, {"answers": [1.0] * n})


def test_call_load_and_finetune_judges():
    bp = {"peak_bytes": 100, "metric_bytes": 100, "outputs": [[1.0, 2.0], [3.0]], "floor_bytes": 10}
    assert judge("ch14-attention", bp, dict(bp, peak_bytes=20, metric_bytes=20))["passed"]
    assert judge("ch14-attention", bp, dict(bp, peak_bytes=20, metric_bytes=20, outputs=[[1.0, 2.5], [3.0]]))[
        "category"] == "incorrect"
    assert judge("ch14-attention", bp, dict(bp, peak_bytes=20, metric_bytes=20, outputs=[[1.0]]))[
        "category"] == "incorrect"
    assert judge("ch14-attention", bp, dict(bp, outputs=[["a"]]))["category"] == "tamper"
    mb = dict(bp, flops=1000)           # ch17: top-2 of 8 experts, at most 1.5 * 2/8 of the starter's matmul FLOPs
    assert judge("ch17-moe", mb, dict(mb, peak_bytes=40, metric_bytes=40, flops=260))["passed"]
    assert judge("ch17-moe", mb, dict(mb, peak_bytes=40, metric_bytes=40, flops=990))["category"] == "technique"
    assert judge("ch17-moe", mb, dict(bp, peak_bytes=40, metric_bytes=40))["category"] == "tamper"

    lb = {"peak_bytes": 300, "model_bytes": 100, "param_count": 5, "dtypes": ["torch.bfloat16"], "on_device": True,
          "fingerprint": [1.0, 2.0]}
    assert judge("ch03-loading", lb, dict(lb, peak_bytes=120))["passed"]
    assert judge("ch03-loading", lb, dict(lb, peak_bytes=120, dtypes=["torch.float32"]))["category"] == "incorrect"
    assert judge("ch03-loading", lb, dict(lb, on_device="yes"))["category"] == "tamper"

    fb = {"peak_bytes": 100, "losses": [5.0, 4.0], "trainable": 1000, "total": 1000, "static_bytes": 10}
    mine = {"peak_bytes": 40, "losses": [5.0, 4.5], "trainable": 10, "total": 1000}
    assert judge("ch24-lora", fb, mine)["passed"]
    assert judge("ch24-lora", fb, dict(mine, trainable=500))["category"] == "incorrect"
    assert judge("ch24-lora", fb, dict(mine, total=-1))["category"] == "tamper"


# ---- the technique probe, in-process on a small GPT-2 --------------------------------------------------------
STEP = '''
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


def train_step(model, optimizer, batch, device):
{body}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)
'''
PLAIN = "    loss = model(input_ids=batch, labels=batch).loss\n    loss.backward()"
HF = "    model.gradient_checkpointing_enable({kwargs})\n" + PLAIN
WRAP = '''    for block in {blocks}:
        if not hasattr(block, "_plain"):
            block._plain = block.forward
            block.forward = lambda *a, _f=block._plain, **k: checkpoint(_f, *a, use_reentrant=False, **k)
''' + PLAIN
SEQUENTIAL = '''    t = model.transformer
    h = t.drop(t.wte(batch) + t.wpe(torch.arange(batch.shape[1]))[None])
    h = checkpoint_sequential(list(t.h), len(t.h), h, use_reentrant=False)
    logits = model.lm_head(t.ln_f(h))
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    loss.backward()'''
ACCUMULATE = '''    total = 0.0
    for chunk in batch.split(batch.shape[0] // 2):
        part = model(input_ids=chunk, labels=chunk).loss / 2
        part.backward()
        total += part.item()
    loss = total'''
EXTRA_NO_GRAD_BLOCK = ACCUMULATE + '''
    with torch.no_grad():
        model.transformer.h[0](model.transformer.wte(batch[:1]))'''
BLOCK_IN_BACKWARD = '''    x = model.transformer.wte(batch[:1]).detach()

    def rerun(grad):
        with torch.no_grad():
            model.transformer.h[0](x)
        return grad
    total = 0.0
    for chunk in batch.split(batch.shape[0] // 2):
        out = model(input_ids=chunk, labels=chunk)
        out.logits.register_hook(rerun)
        part = out.loss / 2
        part.backward()
        total += part.item()
    loss = total'''
AUTOCAST = "    with torch.autocast(device.type, dtype=torch.{dtype}):\n        loss = model(input_ids=batch, labels=batch).loss\n"
SCALER = '''    if not hasattr(model, "_scaler"):
        model._scaler = torch.amp.GradScaler(device.type)
''' + AUTOCAST.format(dtype="float16") + '''    model._scaler.scale(loss).backward()
    model._scaler.step(optimizer)
    model._scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)'''


def run_probe(body: str, steps: int = 2, expect_violations: tuple[str, ...] = ()) -> dict:
    """The learner's step `body` trained on a 4-layer GPT-2 on the simulated device, as the grading
    child runs it: the probe installed before the learner's code, the device's meter underneath."""
    torch = pytest.importorskip("torch")
    import transformers
    from vramlab.models import make_config
    from vramlab.sim.device import SimDevice

    cfg = make_config("tiny", attention="sdpa", dropout=0.0)
    for key, value in {"n_layer": 4, "n_embd": 32, "n_head": 2, "vocab_size": 64}.items():
        setattr(cfg, key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    violations = []
    with SimDevice(timeline=False) as dev:
        model = transformers.GPT2LMHeadModel(cfg).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        batch = torch.randint(0, cfg.vocab_size, (8, 16), generator=torch.Generator().manual_seed(1))
        h = types.SimpleNamespace(torch=torch, dev=dev, sim=True, violate=lambda c, d: violations.append(c))
        probe = technique.Probe(h, model)
        namespace: dict = {}
        exec(compile(STEP.format(body=body), "<submission>", "exec"), namespace)
        try:
            for _ in range(steps):
                with probe.step():
                    namespace["train_step"](model, optimizer, batch, dev)
            report = probe.report()
        finally:
            probe.close()
            torch.set_num_threads(threads)
    assert sorted(set(violations)) == sorted(expect_violations), violations
    return report


@pytest.fixture(scope="module")
def starter_probe():
    return run_probe(PLAIN)


@pytest.mark.parametrize("name, body", [
    ("hf_non_reentrant", HF.format(kwargs='gradient_checkpointing_kwargs={"use_reentrant": False}')),
    ("hf_reentrant", HF.format(kwargs='gradient_checkpointing_kwargs={"use_reentrant": True}')),
    ("checkpoint_sequential", SEQUENTIAL),
    ("hand_written_wrapper", WRAP.format(blocks="model.transformer.h")),
    ("every_other_block", WRAP.format(blocks="list(model.transformer.h)[::2]")),
])
def test_checkpointing_written_any_way_is_observed(name, body, starter_probe):
    mine = run_probe(body)
    assert technique.CHECKS["checkpoint"](starter_probe, mine) is None
    assert all(s["recomputed"] > 0 for s in mine["steps"])


@pytest.mark.parametrize("name, body, says", [
    ("no_checkpointing", PLAIN, "没有检测到"),
    ("accumulation_and_an_extra_no_grad_block", EXTRA_NO_GRAD_BLOCK, "没有检测到"),
    ("a_block_rerun_in_a_backward_hook", BLOCK_IN_BACKWARD, "仍有起始代码的"),
])
def test_what_is_not_checkpointing_is_refused(name, body, says, starter_probe):
    why = technique.CHECKS["checkpoint"](starter_probe, run_probe(body))
    assert why and says in why


@pytest.mark.parametrize("name, body, ok", [
    ("bf16_autocast", AUTOCAST.format(dtype="bfloat16") + "    loss.backward()", True),
    ("fp16_autocast_grad_scaler", SCALER, True),
    ("pure_bf16", "    model.to(torch.bfloat16)\n" + AUTOCAST.format(dtype="bfloat16") + "    loss.backward()", False),
    ("no_autocast", PLAIN, False),
])
def test_mixed_precision_is_observed(name, body, ok, starter_probe):
    mine = run_probe(body)
    assert (technique.CHECKS["autocast"](starter_probe, mine) is None) == ok


def test_accumulation_counts_model_forwards_per_step(starter_probe):
    assert technique.CHECKS["accumulation"](starter_probe, run_probe(ACCUMULATE)) is None
    assert "[1, 1]" in technique.CHECKS["accumulation"](starter_probe, starter_probe)


# ---- the technique where it lives: other correct routes, and forgeries the probe used to believe ----------
TRUNK_HEAD_ACCUMULATION = '''    total = 0.0
    for chunk in batch.split(3):
        hidden = model.transformer(input_ids=chunk).last_hidden_state
        logits = model.lm_head(hidden)
        part = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
        part = part * (chunk.shape[0] / batch.shape[0])
        part.backward()
        total += part.item()
    loss = total'''
BLOCK_LOOP_ACCUMULATION = '''    t = model.transformer
    total = 0.0
    for chunk in batch.split(batch.shape[0] // 2):
        h = t.wte(chunk) + t.wpe(torch.arange(chunk.shape[1]))[None]
        for block in t.h:
            out = block(h)
            h = out[0] if isinstance(out, tuple) else out
        logits = model.lm_head(t.ln_f(h))
        part = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1)) / 2
        part.backward()
        total += part.item()
    loss = total'''
TRUNK_AUTOCAST = '''    with torch.autocast(device.type, dtype=torch.bfloat16):
        hidden = model.transformer(input_ids=batch).last_hidden_state
    logits = model.lm_head(hidden.float())
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    loss.backward()'''
BLOCK_AUTOCAST = '''    for block in model.transformer.h:
        if not hasattr(block, "_bf16"):
            block._bf16 = True
            block.forward = torch.autocast(device.type, dtype=torch.bfloat16)(block.forward)
''' + PLAIN
SUBLAYER_CHECKPOINT = '''    for block in model.transformer.h:
        for sub in (block.attn, block.mlp):
            if not hasattr(sub, "_plain"):
                sub._plain = sub.forward
                sub.forward = lambda *a, _f=sub._plain, **k: checkpoint(_f, *a, use_reentrant=False, **k)
''' + PLAIN
SELECTIVE_CHECKPOINT = '''    import functools
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    context = functools.partial(create_selective_checkpoint_contexts, lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)
    for block in model.transformer.h:
        if not hasattr(block, "_plain"):
            block._plain = block.forward
            block.forward = lambda *a, _f=block._plain, **k: checkpoint(_f, *a, use_reentrant=False, context_fn=context, **k)
''' + PLAIN
SHADOW_HOOKS_FAKE_RECOMPUTE = '''    x = torch.zeros(1, model.config.n_embd)

    def unpack(t):                       # a block module "recomputed" during backward: nothing is
        model.transformer.h[0].ln_1(x)   # recomputed, every activation stayed saved
        return t
    total = 0.0
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        for chunk in batch.split(1):
            part = model(input_ids=chunk, labels=chunk).loss / batch.shape[0]
            part.backward()
            total += part.item()
    loss = total'''
TRUNK_HOOK_AUTOCAST_OFF = '''    tr = model.transformer
    if not hasattr(tr, "_off"):
        tr._off = tr.register_forward_pre_hook(lambda m, a: torch.set_autocast_enabled(device.type, False))
        tr.register_forward_hook(lambda m, a, o: torch.set_autocast_enabled(device.type, True))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()'''
CHECKPOINT_THEN_EXTRA_FORWARD = HF.format(kwargs='gradient_checkpointing_kwargs={"use_reentrant": False}') + '''
    with torch.no_grad():
        model(input_ids=batch[:1])'''
CHECKPOINT_ONE_ROW_SPLIT = '''    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    total = 0.0
    for chunk in (batch[:-1], batch[-1:]):
        part = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch.shape[0])
        part.backward()
        total += part.item()
    loss = total'''
HIDE_FROM_PROBE = '''    probe_mode = torch._C._pop_torch_dispatch_stack(None)    # the probe's mode is on top
    try:
        loss = model(input_ids=batch, labels=batch).loss
    finally:
        torch._C._push_on_torch_dispatch_stack(probe_mode)
    loss.backward()'''


@pytest.mark.parametrize("technique_name, body", [
    ("accumulation", TRUNK_HEAD_ACCUMULATION),      # the trunk and the head per micro-batch, own shifted loss
    ("accumulation", BLOCK_LOOP_ACCUMULATION),      # the blocks called one by one
    ("autocast", TRUNK_AUTOCAST),                   # bf16 trunk, fp32 head and loss
    ("autocast", BLOCK_AUTOCAST),                   # autocast as a decorator on each block's forward
    ("checkpoint", SUBLAYER_CHECKPOINT),            # attention and MLP checkpointed separately
    ("checkpoint", SELECTIVE_CHECKPOINT),           # torch's selective checkpoint (its own dispatch mode on top)
])
def test_the_technique_is_seen_at_the_blocks_whatever_calls_them(technique_name, body, starter_probe):
    assert technique.CHECKS[technique_name](starter_probe, run_probe(body)) is None


@pytest.mark.parametrize("technique_name, body, says", [
    ("checkpoint", SHADOW_HOOKS_FAKE_RECOMPUTE, "仍有起始代码的"),
    ("autocast", TRUNK_HOOK_AUTOCAST_OFF, "16 位 [0, 0]"),
    ("accumulation", CHECKPOINT_THEN_EXTRA_FORWARD, "[1, 1]"),
    ("accumulation", CHECKPOINT_ONE_ROW_SPLIT, "88%"),
])
def test_forged_techniques_are_refused(technique_name, body, says, starter_probe):
    why = technique.CHECKS[technique_name](starter_probe, run_probe(body))
    assert why and says in why, why


def test_work_hidden_from_the_probe_is_tampering(starter_probe):
    mine = run_probe(HIDE_FROM_PROBE, expect_violations=("tamper",))
    assert technique.CHECKS["autocast"](starter_probe, mine)        # and nothing it hid counts


def test_blocks_bytes_every_other_block_about_half(starter_probe):
    """The yardstick of the checkpoint check: all blocks checkpointed leave almost nothing, every other
    block about half, gradient accumulation all of it (summed over its micro-batches)."""
    share = {name: technique.block_bytes(starter_probe, run_probe(body))[0] / technique.block_bytes(starter_probe, starter_probe)[1]
             for name, body in [("all", WRAP.format(blocks="model.transformer.h")),
                                ("every_other", WRAP.format(blocks="list(model.transformer.h)[::2]")),
                                ("accumulation", ACCUMULATE)]}
    assert share["all"] < 0.1 and 0.4 < share["every_other"] < 0.55 and share["accumulation"] > 0.95, share


# ---- a kind is a whole plugin (issue 31) ---------------------------------------------------------------
def _kind_switches(text: str) -> list[int]:
    """Lines where code compares something with a kind's name, or keeps kind names in a *KIND* table."""
    import ast

    from vramlab.grader.kinds import KINDS

    def names(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in KINDS
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names(e) for e in node.elts)
        return False

    hits = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and (names(node.left) or any(names(c) for c in node.comparators)):
            hits.append(node.lineno)
        elif (isinstance(node, ast.Assign) and any("KIND" in getattr(t, "id", "") for t in node.targets)
              and names(node.value)):
            hits.append(node.lineno)
    return sorted(hits)


def test_the_switch_detector_finds_kind_switches():
    assert _kind_switches('if spec.kind == "max_batch":\n    pass\nx = k in ("train_step", "finetune")\n'
                          'NO_MEMORY_KINDS = ("estimate", "monitor")\n') == [1, 3, 4]
    assert _kind_switches('kind = "train_step"\nf(kind="call")\n') == []


def test_no_kind_name_is_tested_outside_kinds():
    """Everything kind-specific lives in vramlab/grader/kinds/ (TRAITS holds what other code needs):
    adding a kind never means editing the notebook builder, the report, the feedback or the site hook."""
    root = Path(__file__).resolve().parents[1]
    files = [p for p in (root / "vramlab").rglob("*.py") if "kinds" not in p.relative_to(root / "vramlab").parts]
    files += list((root / "docs" / "hooks").glob("*.py"))
    found = {str(p.relative_to(root)): hits for p in files if (hits := _kind_switches(p.read_text(encoding="utf-8")))}
    assert not found, f"kind names compared outside vramlab/grader/kinds/: {found}"


def test_every_kind_declares_its_traits():
    from vramlab.grader.kinds import KINDS, traits
    from vramlab.grader.kinds.common import Traits

    assert all(isinstance(k.TRAITS, Traits) for k in KINDS.values())
    assert traits("no-such-kind") == Traits()
    assert traits("finetune").call_name(1) == "prepare_model" and traits("finetune").call_name(3) == "第 2 步"
    assert traits("train_epoch").oom_where({"optimizer_steps": 2, "call": 1}) == "epoch 的第 3 步"
