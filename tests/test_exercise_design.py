"""Every exercise asks for a goal, not a recipe, and is graded on configurations the learner never saw.

Fast tier: reads the specs only. What the grader does with hidden cases is in tests/test_grader.py
and tests/test_alternatives.py (the "fitted to the visible case" submissions).
"""
from __future__ import annotations

import re

import pytest

from vramlab.exercises import EXERCISES
from vramlab.exercises.spec import criteria_zh
from vramlab.notebooks import intro_markdown

IDS = list(EXERCISES)
# ch02's three functions are drawn afresh for every grading (kinds/monitor.py): every case is hidden already
NO_VARIATION = {"ch02-monitor"}


def _visible_text(spec) -> dict[str, str]:
    """What a learner reads before opening a hint: the task, the criteria and the starter."""
    return {"task": spec.task, "criteria": "\n".join(criteria_zh(spec)), "starter": spec.starter}


@pytest.mark.parametrize("exercise_id", IDS)
def test_task_states_the_goal_not_the_line(exercise_id):
    spec = EXERCISES[exercise_id]
    assert spec.giveaways, f"{exercise_id}: name what solves it (spec.giveaways), so the text can be checked"
    for pattern in spec.giveaways:
        re.compile(pattern)
    for where, text in _visible_text(spec).items():
        for pattern in spec.giveaways:
            found = re.search(pattern, text)
            assert not found, f"{exercise_id}: the {where} hands over {found.group(0)!r}"
    for i, hint in enumerate(spec.hints[:-1], 1):
        for pattern in spec.giveaways:
            found = re.search(pattern, hint)
            assert not found, f"{exercise_id}: hint {i} of {len(spec.hints)} hands over {found.group(0)!r}; only the last may"


@pytest.mark.parametrize("exercise_id", IDS)
def test_giveaways_are_what_solves_it(exercise_id):
    """The list is honest: the reference solution uses at least one of the things it may not name."""
    spec = EXERCISES[exercise_id]
    assert any(re.search(p, spec.solution) for p in spec.giveaways), (
        f"{exercise_id}: none of {spec.giveaways} is in the reference solution")


@pytest.mark.parametrize("exercise_id", IDS)
def test_hints_are_progressive(exercise_id):
    spec = EXERCISES[exercise_id]
    assert len(spec.hints) >= 2, f"{exercise_id}: at least a question and then the way"
    assert "？" in spec.hints[0], f"{exercise_id}: the first hint asks a question that points at the cause"
    intro = intro_markdown(spec)
    assert intro.count("<details>") == len(spec.hints)         # folded one by one, in order
    positions = [intro.index(h) for h in spec.hints]
    assert positions == sorted(positions)


@pytest.mark.parametrize("exercise_id", IDS)
def test_graded_on_a_configuration_the_learner_never_saw(exercise_id):
    spec = EXERCISES[exercise_id]
    if exercise_id in NO_VARIATION:
        assert not spec.ci.hidden
        return
    assert spec.ci.hidden, f"{exercise_id}: no hidden variation at ci scale"
    for v in spec.ci.hidden:
        assert v.catches, "say what a fitted solution gets wrong there"
        varied = spec.ci.varied(v)
        assert varied != spec.ci.varied(type(v)(catches=v.catches)), f"{exercise_id}: the variation changes nothing"
        text = intro_markdown(spec)
        for number in {varied.batch, varied.seq} - {spec.ci.batch, spec.ci.seq}:
            assert f"batch={number}" not in text and f"seq={number}" not in text
    assert "隐藏配置" in "\n".join(criteria_zh(spec))               # notebook, page and card say hidden cases exist
