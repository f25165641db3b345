"""Kind "distill_step": `distill_step(student, teacher, optimizer, batch, device)` (ch23). The student
is the job's model, trained by the grader's AdamW; the teacher, a bigger frozen model built from
`teacher_config`, must come back unchanged. Judged like train_step, on the student.
"""
from __future__ import annotations

from . import training
from .common import Traits, WrongAnswer, nbytes, observed_unless_host, settings_class, with_host


@settings_class
class Settings(training.TrainingSettings):
    teacher_config: dict           # overrides of the preset's config for the teacher


TRAITS = Traits(call_zh="第 {k} 步", training_steps=True, per_step_lines=True)
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def setup(h) -> dict:
    """The student and its AdamW, the frozen teacher, one batch per step (also `vramlab.exercise_setup`)."""
    job = h.job
    student, optimizer = h.training_setup()
    teacher = h.build_model(h.settings.teacher_config, seed=job.seed + 7)
    h.payload["static_bytes"] += nbytes(*teacher.parameters())
    rows = h.rank_rows(job.batch)
    batches = [b[rows].clone() for b in h.tokens((job.steps, job.batch, job.seq))]
    return {"student": student, "teacher": teacher, "optimizer": optimizer, "batches": batches}


def scenario(h):
    job = h.job
    built = setup(h)
    student, teacher, optimizer, batches = built["student"], built["teacher"], built["optimizer"], built["batches"]
    before, teacher_before = h.fingerprint(student.parameters()), h.fingerprint(teacher.parameters())
    warmup = job.warmup

    def run(fn):
        losses, times = [], []
        h.reset_peak()
        for i, batch in enumerate(batches):
            if i == warmup:
                h.reset_peak()
            losses.append(h.training_call(lambda: float(fn(student, teacher, optimizer, batch, h.dev)), f"第 {i + 1} 步"))
            times.append(h.seconds)
        if h.fingerprint(teacher.parameters()) != teacher_before:
            raise WrongAnswer("教师模型的参数被改了：蒸馏只训练学生，教师要保持不变")
        return dict(h.training_result(before), peak_bytes=h.peak(), losses=losses,
                    step_seconds=min(times[warmup:] or times))
    return run


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    return training.judge(spec, result, bp, sp)


def criteria_zh(spec) -> list[str]:
    return training.criteria_zh(spec, student=True, extra=("- **教师不变**：教师模型的参数在评分前后完全相同；",))
