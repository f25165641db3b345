"""The judge of the kinds whose lesson is "the same training, less memory" (train_step,
train_epoch, distill_step): the losses and the parameter update equal the trusted starter's, the
peak is above the physical floor the trusted run computed, and at most target_ratio x the
starter's peak.
"""
from __future__ import annotations

import math

from ...units import fmt_bytes
from .common import (INT, NUM, CommonSettings, dict_of, fail, list_of, malformed, memory_lines, optional,
                     passed, ranks_lines, rel, savings, savings_line, scale_settings, settings_class)


@settings_class
class TrainingSettings(CommonSettings):
    report_savings: bool = False       # the result lists bytes saved per memory category (ch30)
    max_host_copy_ratio: float | None = None   # ch28: bytes copied to host memory per measured step, at
                                               # least one and at most this x the starter's peak (a policy,
                                               # not "offload everything")


PAYLOAD = dict(peak_bytes=INT, losses=list_of(NUM), update=list_of(NUM), param_count=INT,
               step_seconds=optional(NUM), rank_peak_bytes=optional(list_of(INT)),
               breakdown=optional(dict_of(INT)), host_copy_bytes=optional(INT))


def judge(spec, result: dict, bp: dict, sp: dict, technique=None) -> dict:
    """`technique(spec, bp, sp)` -> None or why the required technique was not observed (train_step)."""
    why = malformed(sp, **PAYLOAD)
    if why:
        return fail(result, "tamper", why)
    peak, base_peak = sp["peak_bytes"], int(bp["peak_bytes"])
    result.update(peak_bytes=peak, rank_peak_bytes=sp.get("rank_peak_bytes"))
    if scale_settings(spec, result).report_savings and bp.get("breakdown") and sp.get("breakdown"):
        result["savings"] = savings(bp["breakdown"], sp["breakdown"])      # which technique bought how much
    result["ratio"] = round(peak / base_peak, 4) if base_peak else None
    result["step_seconds"] = sp.get("step_seconds")
    if bp.get("step_seconds") and sp.get("step_seconds") is not None:
        result["time_ratio"] = round(sp["step_seconds"] / bp["step_seconds"], 3)
    # correctness: per-step losses and the parameter update, against the trusted starter
    bl, sl = bp["losses"], sp["losses"]
    loss_err = 0.0
    ok_losses = len(bl) == len(sl) and all(math.isfinite(s) for s in sl)
    if ok_losses:
        for b, s in zip(bl, sl):
            loss_err = max(loss_err, abs(s - b) / max(abs(b), 1e-12))
            if abs(s - b) > spec.atol + spec.rtol * abs(b):
                ok_losses = False
    result["loss_max_rel_err"] = loss_err if ok_losses or len(bl) == len(sl) else None
    upd_err = rel(sp["update"], bp["update"]) if len(sp["update"]) == len(bp["update"]) else math.inf
    result["update_rel_err"] = upd_err
    same_params = sp["param_count"] == bp.get("param_count")
    ok_update = math.isfinite(upd_err) and upd_err <= spec.update_rtol and same_params
    result["correct"] = bool(ok_losses and ok_update)
    if not same_params:
        return fail(result, "incorrect", "模型的参数个数变了：不要替换或删减模型")
    if not ok_losses:
        return fail(result, "incorrect",
                    f"返回的损失与起始代码不同（起始代码 {['%.5f' % x for x in bl]}，你的 {['%.5f' % x for x in sl]}，"
                    f"允许误差 rtol={spec.rtol:g}）。是不是损失的加权或缩放不对、返回了旧的/缓存的值，"
                    f"或者跳过了某些计算？")
    if not ok_update:
        return fail(result, "incorrect",
                    f"参数更新与起始代码不同（相对误差 {upd_err:.3g}，允许 {spec.update_rtol:.3g}）："
                    "梯度要与整个 batch 一起算的相同，每一步要调用一次 optimizer.step()")
    why_not = technique(spec, bp, sp) if technique else None
    if why_not:
        return fail(result, "technique", why_not)
    if peak < int(bp.get("static_bytes", 0)):
        return fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于参数+梯度+优化器状态的物理下限 "
                                      f"{fmt_bytes(bp['static_bytes'])}：显存计量被绕过了")
    if base_peak and peak > spec.target_ratio * base_peak:
        return fail(result, "too_much_memory",
                    f"峰值 {fmt_bytes(peak)} 是起始代码（{fmt_bytes(base_peak)}）的 {peak / base_peak:.2f} 倍，"
                    f"目标是不超过 {spec.target_ratio:.2f} 倍")
    why_not = _host_copy(scale_settings(spec, result), result, sp.get("host_copy_bytes"), base_peak)
    if why_not:
        return fail(result, "technique", why_not)
    if spec.max_time_ratio and result["time_ratio"] and result["time_ratio"] > spec.max_time_ratio:
        return fail(result, "slow", f"单步耗时是起始代码的 {result['time_ratio']:.2f} 倍，允许 {spec.max_time_ratio:.2f} 倍")
    return passed(spec, result, f"峰值是起始代码的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}），结果与起始代码一致"
                                + savings_line(result))


def use_learner_budget(h, settings) -> None:
    """The learner's run is on a virtual card of `settings.learner_budget_mib` (ch21, ch30, the stage
    challenges); the trusted starter runs without it (it need not fit)."""
    if getattr(settings, "learner_budget_mib", None) and not h.job.reference:
        h.dev.set_budget(int(float(settings.learner_budget_mib) * 2 ** 20))


def budget_line_zh(spec, run: str) -> list[str]:
    """The "fits the card" criterion, when the spec has a virtual card; `run`: what must not OOM."""
    budget = getattr(spec.ci.settings, "learner_budget_mib", None)
    if not budget:
        return []
    return [f"- **装得下**：你的代码在 {budget:g} MiB 的虚拟显卡上运行（CI 规模），{run}都不能 OOM；"
            "起始代码在这张卡上放不下，它只在不限显存的情况下运行，作为对照。"]


def _host_copy(settings, result: dict, copied, base_peak: int) -> str | None:
    """ch28: offloading is required, and only what the policy needs: moving the parameters', the
    output layer's and the loss's saved tensors too buys no peak and costs transfer time."""
    limit = getattr(settings, "max_host_copy_ratio", None)
    if not limit:
        return None
    if not isinstance(copied, int) or copied < 0:
        return "结果里没有搬到主存的字节数：结果被改写了，或者没有经过评分器的设备"
    result["host_copy_bytes"] = copied
    result["host_copy_ratio"] = round(copied / base_peak, 4) if base_peak else None
    if copied == 0:
        return "测量的那一步没有任何张量搬到主存：本题要求把为反向保存的激活值卸载到主存（只用激活检查点不算）"
    if base_peak and copied > limit * base_peak:
        return (f"每步搬到主存 {fmt_bytes(copied)}，是起始代码峰值的 {copied / base_peak:.2f} 倍，允许 {limit:.2f} 倍："
                "不是什么都值得搬。想一想哪些为反向保存的张量搬走之后峰值并不会降低")
    return None


def criteria_zh(spec, student: bool = False, extra: tuple[str, ...] = ()) -> list[str]:
    """`student`: distillation (the losses and update of the student); `extra`: kind-specific lines."""
    who = "学生模型的" if student else ""
    return [*ranks_lines(spec),
            f"- **正确**：损失与{who}更新后的参数和起始代码一致（`rtol={spec.rtol:g}`，`atol={spec.atol:g}`）；",
            *extra, *memory_lines(spec)]
