"""`exercise_setup(id)`: what the grader gave your function, rebuilt in your own process.

    s = vramlab.exercise_setup("ch07-checkpoint")
    with s.device:                                  # the simulated device the grader used
        s.device.reset_peak_memory_stats()
        train_step(*s.args)                         # model, optimizer, first batch, device
        print(s.device.max_memory_allocated(), s.device.breakdown())

The model (same preset, config, seed and weights), the optimizer, the batches and the device
settings (cuBLAS workspaces, the virtual card's size) come from the same builders as a grading
child's (vramlab.grader.build and the kind's `setup`), for the case you see in the notebook: trace
it, read its breakdown, time it, with the chapter's tools. The grader runs `s.steps` calls and
measures the peak after the first `s.warmup` of them; the starter's peak is measured the same way.
"""
from __future__ import annotations

import dataclasses
import inspect
import types


class ExerciseSetup(types.SimpleNamespace):
    """The graded case: `device`, `args` (the function's arguments in order) and each argument by
    name (`model`, `optimizer`, `batch`, ...), plus `batches` (one per step), `steps`, `warmup`."""

    def __repr__(self):
        names = ", ".join(self.arg_names)
        return (f"<{self.exercise} 的评分配置：{self.function}({names})，{self.steps} 步，"
                f"前 {self.warmup} 步预热之后测峰值>")


def exercise_setup(exercise_id: str, *, scale: str = "ci", _hidden: int = 0) -> ExerciseSetup:
    """The visible case of exercise `exercise_id` as the grader builds it (`scale="ci"`, the
    simulated device). Exercises of the training kinds (train_step, train_epoch, distill_step,
    finetune) only; `_hidden` (instructors, tests) builds hidden case i instead."""
    import torch

    from .exercises import get_exercise
    from .grader import build
    from .grader.core import make_job
    from .grader.kinds import get_kind
    from .sim.device import SimDevice

    spec = get_exercise(exercise_id)
    kind = get_kind(spec.kind)
    if not hasattr(kind, "setup"):
        raise ValueError(f"{exercise_id} 的函数拿到的输入不是模型和优化器（题型 {spec.kind}），"
                         "notebook 里的示例单元格已经给出了它们的形状；exercise_setup 只用于训练类练习")
    if _hidden:
        spec = dataclasses.replace(spec, **{scale: getattr(spec, scale).varied(getattr(spec, scale).hidden[_hidden - 1])})
    job = make_job(spec, scale, "sim", threads=torch.get_num_threads())
    settings = kind.Settings(**job.settings)
    world = job.world_size
    dev = SimDevice(cublas_workspace=bool(getattr(settings, "cublas_workspace", True)))
    h = types.SimpleNamespace(job=job, settings=settings, torch=torch, dev=dev, sim=True, payload={}, rank=0,
                              world=world, rank_rows=lambda n: slice(0, n // world), model=None,
                              gen=torch.Generator().manual_seed(job.seed + 2))
    build.attach(h)
    with dev:
        built = kind.setup(h)
    budget = getattr(settings, "learner_budget_mib", None)
    if budget:                                   # the learner's run is on a virtual card of this size
        dev.set_budget(int(float(budget) * 2 ** 20))
    if "batches" in built:
        built["batch"] = built["batches"][0]
    params = list(inspect.signature(_signature(spec)).parameters)
    missing = [p for p in params if p not in built and p != "device" and p not in _DEFAULTED]
    if missing:
        raise AssertionError(f"{exercise_id}: setup gives no {missing}")
    built["device"] = dev
    args = tuple(built[p] for p in params if p in built)
    scale_obj = getattr(spec, scale)
    return ExerciseSetup(exercise=spec.id, function=spec.function, arg_names=[p for p in params if p in built],
                         args=args, steps=job.steps, warmup=job.warmup, world_size=world,
                         model_preset=scale_obj.model, config=dict(job.config), **built)


_DEFAULTED = {"temperature"}       # parameters with a default the grader leaves as it is


def _signature(spec):
    namespace: dict = {}
    exec(spec.signature + "\n    pass\n", namespace)
    return namespace[spec.function]
