"""grade-bench's choice of exercises: `--chapters` is the issue's class, one exercise per chapter."""
from vramlab.exercises import EXERCISES
from vramlab.grader.bench import select


def test_chapters_are_the_thirty_chapter_exercises():
    chosen = select(None, chapters=True)
    assert len(chosen) == 30
    assert sorted(EXERCISES[i].chapter for i in chosen) == list(range(1, 31))
    assert set(EXERCISES) - set(chosen) == {"stage1-challenge", "stage2-challenge", "stage3-challenge"}


def test_chapters_narrow_an_explicit_choice():
    assert select(["ch07-checkpoint", "stage2-challenge"], chapters=True) == ["ch07-checkpoint"]
    assert select(["ch07-checkpoint", "stage2-challenge"]) == ["ch07-checkpoint", "stage2-challenge"]
    assert select(None) is None
