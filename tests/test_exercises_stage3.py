"""Stage-3 exercises of kind "call" (ch16 GQA, ch17 MoE, ch18 RMSNorm): the reference solution
passes, the starter fails, and a wrong answer is refused, through the real isolated grader on the
simulated device at ci scale. (ch19-offload, kind train_step, runs in tests/test_exercises.py.)"""
from __future__ import annotations

import pytest

from vramlab.exercises import get_exercise
from vramlab.grader import grade_source

pytestmark = pytest.mark.slow       # starts processes: the full tier (make test), not make check


@pytest.mark.parametrize("exercise_id", ["ch16-gqa", "ch17-moe", "ch18-rmsnorm"])
def test_solution_passes_and_starter_fails(exercise_id):
    spec = get_exercise(exercise_id)
    good = grade_source(exercise_id, spec.solution, reuse_baseline=True)
    assert good["passed"] and good["correct"] is True, good["reason"]
    assert max([good["ratio"], *(good.get("hidden_ratios") or [])]) <= spec.target_ratio - 0.05
    bad = grade_source(exercise_id, spec.starter, reuse_baseline=True)
    assert not bad["passed"] and bad["category"] == "too_much_memory" and bad["correct"] is True, bad["reason"]


@pytest.mark.parametrize("exercise_id,old,new", [
    # gates from a softmax over all experts instead of over the chosen top-k
    ("ch17-moe", "top_gates = torch.softmax(top_logits, dim=-1)",
     "top_gates = torch.softmax(logits, dim=-1).gather(-1, top_idx)"),
    # the backward forgets the projection term: plausible, cheap, and wrong
    ("ch18-rmsnorm", "grad_x = (rstd * (g - h * rstd.pow(2) * dot)).to(x.dtype)", "grad_x = (rstd * g).to(x.dtype)"),
])
def test_wrong_answers_are_incorrect(exercise_id, old, new):
    src = get_exercise(exercise_id).solution
    assert old in src
    r = grade_source(exercise_id, src.replace(old, new), reuse_baseline=True)
    assert not r["passed"] and r["category"] == "incorrect", r["reason"]
