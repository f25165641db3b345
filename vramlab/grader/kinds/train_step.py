"""Kind "train_step": `train_step(model, optimizer, batch, device)`, one optimizer update per call.

The harness runs the warm-up steps, then the measured ones; the judge wants the starter's losses
and parameter update, a peak at most target_ratio x the starter's, and, where the spec names one,
the technique observed while the learner trained (vramlab.grader.kinds.technique).
"""
from __future__ import annotations

import contextlib

from . import technique, training
from .common import Traits, fail, host_meter, malformed, observed_unless_host, settings_class, with_host


@settings_class
class Settings(training.TrainingSettings):
    learner_budget_mib: float | None = None   # the learner's run is on a virtual card of this size (ch21, ch30);
                                              # the trusted starter runs without it (it need not fit)


TRAITS = Traits(call_zh="第 {k} 步", training_steps=True, per_step_lines=True, techniques=tuple(technique.CHECKS))
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def setup(h) -> dict:
    """What the learner's function is called with, built before any learner code runs (also
    `vramlab.exercise_setup`): the model, its AdamW, one batch per step (this rank's rows)."""
    job = h.job
    model, optimizer = h.training_setup()
    rows = h.rank_rows(job.batch)        # data parallel: this rank's share of every global batch
    batches = [b[rows].clone() for b in h.tokens((job.steps, job.batch, job.seq))]
    return {"model": model, "optimizer": optimizer, "batches": batches}


def scenario(h):
    settings, job = h.settings, h.job
    built = setup(h)
    model, optimizer, batches = built["model"], built["optimizer"], built["batches"]
    before = h.fingerprint(model.parameters())
    training.use_learner_budget(h, settings)
    probe = technique.Probe(h, model)
    warmup = job.warmup
    meter = host_meter(h) if settings.max_host_copy_ratio else None     # ch28: bytes copied to host per step

    def run(fn):
        losses, times, first_peak, copied = [], [], 0, []
        h.reset_peak()
        for i, batch in enumerate(batches):
            if i == warmup:
                h.reset_peak()
            before_step = meter.created if meter else 0
            try:
                with probe.step(), (meter or contextlib.nullcontext()):
                    losses.append(h.training_call(lambda: float(fn(model, optimizer, batch, h.dev)), f"第 {i + 1} 步"))
            except h.torch.OutOfMemoryError as e:      # say which step: a leak overflows late, a big step at once
                raise h.torch.OutOfMemoryError(f"第 {i + 1} 步显存溢出（前面 {i} 步都放得下）。{e}") from None
            times.append(h.seconds)
            if settings.allow_host and _state_off_device(h, optimizer):
                h.violate("tamper", "评分器的优化器把设备上参数的状态建在了主存里（例如在 device.host() 里调用 "
                                    "optimizer.step()）：在真卡上 host() 什么也不做，状态照样在显存里，这不是卸载。"
                                    "卸载要让状态连同它更新的那份参数一起待在主存里")
            copied.append(meter.created - before_step if meter else 0)
            first_peak = first_peak or h.peak()
        return dict(h.training_result(before), peak_bytes=h.peak(), first_step_peak_bytes=first_peak, losses=losses,
                    step_seconds=min(times[warmup:] or times), technique=probe.report(),
                    host_copy_bytes=max(copied[warmup:] or copied) if meter else None)
    return run


def _state_off_device(h, optimizer) -> bool:
    """The grader's optimizer holds host-memory state for a parameter on the device: the sim's
    `host()` around `optimizer.step()` would file it off the meter, which a GPU cannot do."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if h.tracked(p) and any(isinstance(v, h.torch.Tensor) and v.numel() > 1 and not h.tracked(v)
                                    for v in optimizer.state.get(p, {}).values()):
                return True
    return False


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    if spec.technique:
        why = malformed(sp, technique=technique.PAYLOAD)
        if why:
            return fail(result, "tamper", why)
    return training.judge(spec, result, bp, sp, technique=technique.missing)


def criteria_zh(spec) -> list[str]:
    lines = training.criteria_zh(spec, extra=(technique.CRITERIA_ZH[spec.technique],) if spec.technique else ())
    limit = spec.ci.settings.max_host_copy_ratio
    if limit:
        lines.append(f"- **卸载，但有取舍**：测量的那一步要把一些为反向保存的张量搬到主存，而搬到主存的数据 ≤ 起始代码峰值的 "
                     f"**{limit * 100:g}%**（评分器在设备的 `host()` 里统计新建的主存张量）。")
    lines += training.budget_line_zh(spec, "任何一步")
    return lines
