"""The course's graded exercises: one `ExerciseSpec` per exercise.

    from vramlab.exercises import EXERCISES, get_exercise, list_exercises

The learner notebook lives at `exercises/<id>/<id>.ipynb`, the reference solution at
`solutions/<id>/<id>.ipynb` (both relative to the course root). The grader never imports this
package inside the learner's process: the trusted parent reads the spec and hands the child only
the starter source and the workload sizes.
"""
from __future__ import annotations

from .spec import ExerciseSpec, Scale
from . import (ch01_estimate, ch02_monitor, ch03_loading, ch04_dataloading, ch05_accumulation,
               ch06_mixed_precision, ch07_checkpoint, ch08_allreduce, ch09_tensor_parallel, ch10_zero,
               ch11_fragmentation, ch12_eval_loop, ch13_max_batch, ch14_attention, ch15_embedding_offload,
               ch16_gqa, ch17_moe, ch18_rmsnorm, ch19_offload, ch20_overlap, ch21_leak, ch22_int8_linear,
               ch23_distill, ch24_lora, ch25_dora, ch26_prompt_tuning, ch27_prefix_tuning, ch28_activation_offload,
               ch29_zero2, ch30_capstone, stage1_challenge, stage2_challenge, stage3_challenge)

EXERCISES: dict[str, ExerciseSpec] = {      # in course order: each stage's challenge after its last chapter
    m.SPEC.id: m.SPEC for m in (
        ch01_estimate, ch02_monitor, ch03_loading, ch04_dataloading, ch05_accumulation, stage1_challenge,
        ch06_mixed_precision, ch07_checkpoint, ch08_allreduce, ch09_tensor_parallel, ch10_zero, ch11_fragmentation,
        ch12_eval_loop, ch13_max_batch, ch14_attention, ch15_embedding_offload, stage2_challenge,
        ch16_gqa, ch17_moe, ch18_rmsnorm, ch19_offload, ch20_overlap, ch21_leak, ch22_int8_linear, ch23_distill,
        ch24_lora, ch25_dora, stage3_challenge,
        ch26_prompt_tuning, ch27_prefix_tuning, ch28_activation_offload, ch29_zero2, ch30_capstone)
}


def get_exercise(exercise_id: str) -> ExerciseSpec:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise KeyError(f"未知练习 {exercise_id!r}；可选：{'、'.join(EXERCISES)}") from None


def notebook_path(exercise_id: str) -> str:
    return f"exercises/{exercise_id}/{exercise_id}.ipynb"


def solution_path(exercise_id: str) -> str:
    """The nbgrader source notebook (the reference solution inside the solution markers)."""
    return f"solutions/{exercise_id}/{exercise_id}.ipynb"


def list_exercises(instructor: bool = False) -> list[dict]:
    """What a learner needs to start each exercise; `instructor=True` adds where its reference
    solution is (the nbgrader source notebook and solutions/<id>/solution.py, outside the package)
    and the spec module (the hidden cases)."""
    items = []
    for s in EXERCISES.values():
        item = {"id": s.id, "chapter": s.chapter, "kind": s.kind, "title": s.title, "function": s.function,
                "signature": s.signature, "target_ratio": s.target_ratio, "points": s.points,
                "notebook": notebook_path(s.id)}
        if instructor:
            item.update(solution=solution_path(s.id), solution_source=f"solutions/{s.id}/solution.py",
                        spec=f"vramlab/exercises/{s.id.replace('-', '_')}.py")
        items.append(item)
    return items


__all__ = ["EXERCISES", "ExerciseSpec", "Scale", "get_exercise", "list_exercises", "notebook_path",
           "solution_path"]
