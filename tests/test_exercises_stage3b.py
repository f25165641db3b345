"""Exercises of chapters 20-30 that the generic starter/solution test cannot cover: the leak that
overflows a virtual card (ch21), INT8 weights (ch22, kind call), distillation's frozen teacher
(ch23), the peft methods (ch24-27, kind finetune) and the capstone on its card (ch30). Real isolated
grader, simulated device, ci scale. (The starter/solution pairs of ch20, ch23, ch28 and ch29 run in
tests/test_exercises.py.)"""
from __future__ import annotations

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import grade_source

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check


def _graded(exercise_id, source):
    return grade_source(exercise_id, source, reuse_baseline=True)


def test_leak_starter_overflows_the_card_and_the_fix_fits():
    spec = get_exercise("ch21-leak")
    good = _graded("ch21-leak", spec.solution)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio - 0.05
    budget = spec.ci.settings.learner_budget_mib * 2 ** 20
    assert good["peak_bytes"] < budget < good["baseline_peak_bytes"]      # the starter alone does not fit
    bad = _graded("ch21-leak", spec.starter)
    assert not bad["passed"] and bad["category"] == "oom", bad["reason"]
    assert "步显存溢出" in bad["reason"] and "前面" in bad["reason"]         # which step, and that earlier ones fit


def test_leak_half_fix_with_detach_still_overflows():
    # fixing one of the two leaks (the forward hook's metric) leaves the entropy sum and its graph: still overflows
    starter = get_exercise("ch21-leak").starter
    src = starter.replace('mon["mlp_act"].append(output.abs().mean())',
                          'mon["mlp_act"].append(output.detach().abs().mean().item())')
    assert src != starter
    r = _graded("ch21-leak", src)
    assert not r["passed"] and r["category"] == "oom", r["reason"]


def test_overlap_rejects_ch08_in_place_allreduce():
    # in-place AllReduce after backward is ch08's answer, and ch20's starter: no gradient is freed early
    r = _graded("ch20-overlap", get_exercise("ch08-allreduce").solution)
    assert not r["passed"] and r["category"] == "too_much_memory", r["reason"]


def test_int8_linear_solution_passes_starter_fails_wrong_scale_incorrect():
    spec = get_exercise("ch22-int8-linear")
    good = _graded("ch22-int8-linear", spec.solution)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio - 0.05
    bad = _graded("ch22-int8-linear", spec.starter)
    assert not bad["passed"] and bad["category"] == "too_much_memory" and bad["correct"] is True, bad["reason"]
    # the scale applied per input column instead of per output channel: plausible and wrong
    wrong = spec.solution.replace("out[:, rows] *= scale[rows]", "out[:, rows] *= scale[:block.shape[1]].mean()")
    assert wrong != spec.solution
    r = _graded("ch22-int8-linear", wrong)
    assert not r["passed"] and r["category"] == "incorrect", r["reason"]


def test_distill_must_leave_the_teacher_unchanged():
    # "training" the teacher too: same student, but the teacher moves
    src = get_exercise("ch23-distill").solution.replace(
        "    optimizer.step()\n",
        "    optimizer.step()\n    with torch.no_grad():\n        next(teacher.parameters()).mul_(0.5)\n")
    r = _graded("ch23-distill", src)
    assert not r["passed"] and r["category"] == "incorrect" and "教师" in r["reason"], r["reason"]


@pytest.mark.parametrize("exercise_id", ["ch24-lora", "ch25-dora", "ch26-prompt-tuning", "ch27-prefix-tuning"])
def test_peft_solution_passes_and_full_finetuning_fails(exercise_id):
    spec = get_exercise(exercise_id)
    good = _graded(exercise_id, spec.solution)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio - 0.05
    assert 0 < good["trainable"] <= spec.ci.settings.max_trainable_share * good["total"]
    bad = _graded(exercise_id, spec.starter)
    assert not bad["passed"] and bad["category"] == "technique" and "peft" in bad["reason"], bad["reason"]


LORA = get_exercise("ch24-lora").solution


@pytest.mark.parametrize("source,why,category", [
    # the right library, the wrong method for the chapter
    (get_exercise("ch26-prompt-tuning").solution, "PromptTuningConfig", "technique"),
    # DoRA is not what chapter 24 asks for
    (LORA.replace('task_type="CAUSAL_LM",', 'task_type="CAUSAL_LM", use_dora=True,'), "use_dora", "technique"),
    # a rank so large that nearly everything trains again
    (LORA.replace("r=8, lora_alpha=16", "r=256, lora_alpha=512"), "可训练参数占", "incorrect"),
    # the adapter does not start as the identity: B initialised randomly
    (LORA.replace('task_type="CAUSAL_LM",', 'task_type="CAUSAL_LM", init_lora_weights=False,'), "第 1 步的损失", "incorrect"),
    # a different, much smaller model: nothing of the grader's model is in it
    ("import torch\n\ndef prepare_model(model):\n    return torch.nn.Linear(4, 4)\n", "不包含", "incorrect"),
])
def test_lora_wrong_answers_are_refused(source, why, category):
    assert source != LORA
    r = _graded("ch24-lora", source)
    assert not r["passed"] and r["category"] == category and why in r["reason"], r["reason"]


CAPSTONE = get_exercise("ch30-capstone")


def test_capstone_solution_fits_and_reports_what_each_category_saved():
    good = _graded("ch30-capstone", CAPSTONE.solution)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= CAPSTONE.target_ratio - 0.05
    saved = good["savings"]
    # checkpointing, micro-batches and 8-bit states each show up in their own category
    for category in ("activations", "temporaries", "optimizer_state"):
        assert saved[category] > 2 ** 20, saved
    assert "激活值 省下" in good["reason"] and "优化器状态 省下" in good["reason"]
    bad = _graded("ch30-capstone", CAPSTONE.starter)
    assert not bad["passed"] and bad["category"] == "oom" and "第 1 步显存溢出" in bad["reason"], bad["reason"]


def test_capstone_one_technique_is_not_enough():
    ckpt_only = CAPSTONE.starter.replace(
        "    loss = model(",
        "    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})\n    loss = model(")
    assert ckpt_only != CAPSTONE.starter
    r = _graded("ch30-capstone", ckpt_only)
    assert not r["passed"] and r["category"] == "oom", r["reason"]


def test_capstone_native_calls_only_from_bitsandbytes_itself():
    # ctypes is allowed for bitsandbytes' own kernels, not for the learner
    src = CAPSTONE.solution.replace("import bitsandbytes as bnb", "import bitsandbytes as bnb\nimport ctypes")
    src = src.replace("    total = 0.0\n", "    total = 0.0\n    ctypes.CDLL(None).getpid()\n")
    assert src.count("ctypes") == 2
    r = _graded("ch30-capstone", src)
    assert not r["passed"] and r["category"] in ("forbidden", "exception"), r["reason"]
    assert any(v["category"] == "native" for v in r["violations"]) or "ctypes" in r["reason"], r
