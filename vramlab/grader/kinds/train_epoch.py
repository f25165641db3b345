"""Kind "train_epoch": `train_epoch(model, optimizer, tokens, device, batch_size)`, one pass over a
dataset that lives in HOST memory (ch04). The peak covers the whole epoch; judged like train_step.
"""
from __future__ import annotations

from . import training
from .common import Traits, observed_unless_host, settings_class, with_host


@settings_class
class Settings(training.TrainingSettings):
    n_samples: int                 # rows of the host dataset; the job's batch is the batch size
    learner_budget_mib: float | None = None   # the learner's epoch runs on a virtual card of this size
                                              # (stage1-challenge); the trusted starter runs without it


TRAITS = Traits(call_zh="这个 epoch", epoch=True)
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def setup(h) -> dict:
    """The model, its AdamW and the dataset in host memory (also `vramlab.exercise_setup`)."""
    model, optimizer = h.training_setup()
    tokens = h.tokens((h.settings.n_samples, h.job.seq), on_host=True)
    return {"model": model, "optimizer": optimizer, "tokens": tokens, "batch_size": h.job.batch}


def scenario(h):
    settings = h.settings
    built = setup(h)
    model, optimizer, data, bs = built["model"], built["optimizer"], built["tokens"], built["batch_size"]
    n = settings.n_samples
    before = h.fingerprint(model.parameters())
    training.use_learner_budget(h, settings)

    def run(fn):
        h.reset_peak()
        steps = -(-n // bs)
        losses = h.training_call(lambda: [float(x) for x in fn(model, optimizer, data, h.dev, bs)], "这个 epoch ",
                                 min_steps=steps)
        return dict(h.training_result(before), peak_bytes=h.peak(), losses=losses, step_seconds=h.seconds / steps)
    return run


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    return training.judge(spec, result, bp, sp)


def criteria_zh(spec) -> list[str]:
    return [*training.criteria_zh(spec), *training.budget_line_zh(spec, "整个 epoch 中途")]
