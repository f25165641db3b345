"""The exercises whose skill is not "make train_step smaller" (kinds estimate, monitor, load,
train_epoch): the reference solution passes, the starter fails, and one hostile submission per
kind is refused, through the real isolated grader on the simulated device at ci scale.
(ch04-dataloading's solution/starter run in tests/test_exercises.py with the other training kinds.)"""
from __future__ import annotations

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import grade_source
from vramlab.grader.report import format_result

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check

KEYS = {"exercise", "kind", "passed", "score", "max_score", "peak_bytes", "baseline_peak_bytes", "ratio",
        "target_ratio", "correct", "reason", "backend", "category"}


@pytest.mark.parametrize("exercise_id,starter_category", [
    ("ch01-estimate", "incorrect"), ("ch02-monitor", "incorrect"), ("ch03-loading", "too_much_memory")])
def test_solution_passes_and_starter_fails(exercise_id, starter_category):
    spec = get_exercise(exercise_id)
    good = grade_source(exercise_id, spec.solution, reuse_baseline=True)
    assert KEYS <= set(good)
    assert good["passed"] and good["score"] == spec.points and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio * 0.75                 # margin below the target
    assert "通过" in format_result(good)
    bad = grade_source(exercise_id, spec.starter, reuse_baseline=True)
    assert not bad["passed"] and bad["score"] == 0
    assert bad["category"] == starter_category, bad["reason"]
    assert bad["ratio"] is not None and bad["ratio"] > spec.target_ratio


HOSTILE = {
    # the estimate must be a formula: measuring it on a simulated device of its own is refused
    "estimate_measures": ("ch01-estimate", "forbidden", '''
import torch
from vramlab.sim.device import SimDevice

def estimate_static_bytes(n_params, optimizer, precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with SimDevice() as d:
        p = torch.nn.Parameter(torch.zeros(n_params, dtype=dtype))
        p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW([p]) if optimizer == "adamw" else torch.optim.SGD([p], lr=1.0,
              momentum=0.9 if optimizer == "sgdm" else 0.0)
        opt.step()
        b = d.breakdown(at_peak=False)
    return b["parameters"] + b["gradients"] + b["optimizer_state"]
'''),
    # reading "the answer" off the grader's device: there is none in the learner's process
    "estimate_reads_meter": ("ch01-estimate", "incorrect", '''
from vramlab.sim.device import current_sim_device

def estimate_static_bytes(n_params, optimizer, precision):
    d = current_sim_device()
    return d.max_allocated() if d is not None else 0
'''),
    # a number copied from earlier feedback: the hidden functions change with every grading
    "monitor_hardcoded": ("ch02-monitor", "incorrect", '''
def measure_peak(fn, device):
    fn()
    return 118353920
'''),
    # never runs fn: reads whatever peak is left over
    "monitor_skips_fn": ("ch02-monitor", "incorrect", '''
def measure_peak(fn, device):
    return device.max_allocated()
'''),
    "load_returns_fp32": ("ch03-loading", "incorrect", '''
from vramlab.models import build_model
MODEL_NAME = "tiny"

def load_model(device):
    return build_model(MODEL_NAME, seed=0, device=device.torch_device)
'''),
    # build in "host memory" and return it there: ch03 allows host memory (it is measured against
    # its own limit), but a model that never reaches the device is not loaded
    "load_on_host": ("ch03-loading", "incorrect", '''
import torch
from vramlab.models import build_model
MODEL_NAME = "tiny"

def load_model(device):
    with device.host():
        return build_model(MODEL_NAME, seed=0, dtype=torch.bfloat16)
'''),
    # feed host slices straight to the model: no batch is ever charged to the device
    "epoch_host_batches": ("ch04-dataloading", "tamper", '''
def train_epoch(model, optimizer, tokens, device, batch_size):
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
'''),
}


SLOW = {"estimate_reads_meter", "monitor_skips_fn", "load_on_host"}     # one fast hostile case per kind stays


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in HOSTILE])
def test_hostile_submission_per_kind(name):
    exercise_id, category, source = HOSTILE[name]
    r = grade_source(exercise_id, source, reuse_baseline=True, timeout_s=60)
    assert not r["passed"] and r["score"] == 0
    assert r["category"] == category, r["reason"]
    assert any("\u4e00" <= ch <= "\u9fff" for ch in r["reason"])


@pytest.mark.slow
def test_monitor_cases_change_with_every_grading():
    """Every grading draws its own hidden sizes (a fresh case_seed in the job), and the sizes change
    what the trusted child measures. (Comparing two gradings' reported peaks instead would fail now
    and then: the worst case's truth takes few values, and two draws can land on the same one.)"""
    from vramlab.grader import policy
    from vramlab.grader.core import DEFAULT_MEMORY, make_job
    from vramlab.grader.sandbox import run_job

    spec = get_exercise("ch02-monitor")
    assert len({make_job(spec, "ci", "sim").case_seed for _ in range(5)}) == 5
    truths = []
    for seed in (1, 2):          # random.Random(1) and (2) draw different sizes for both sized functions
        run = run_job(make_job(spec, "ci", "sim").with_(case_seed=seed, reference=True), spec.starter, 120,
                      DEFAULT_MEMORY["ci"], use_sandbox=policy.bwrap_path() is not None)
        truths.append({a["case"]: a["truth"] for a in run.payload["answers"]})
    assert truths[0]["transient"] != truths[1]["transient"] and truths[0]["keeps_output"] != truths[1]["keeps_output"]
    assert truths[0]["train_step"] == truths[1]["train_step"]
    assert grade_source("ch02-monitor", spec.solution)["passed"]
