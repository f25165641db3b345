"""Kind "load": `load_model(device)` builds a bf16 model (ch03). The peak while it runs, and the
model it returns: every parameter bf16, on the device, equal to the trusted starter's model; the
device peak at most `max_model_multiple` x the model's own bytes and target_ratio x the starter's
peak; the HOST memory it holds at any moment at most `max_host_multiple` x the model's bytes.

Host memory is counted in the child while the learner's code runs (`HostMeter`): every storage
created in host memory (on the sim: under `device.host()`, which the simulated device does not
charge; on a GPU: a CPU storage), released when the storage dies, the peak of the live sum. Like the
device meter, it is feedback inside the learner's interpreter, not a boundary: memory hidden from
both (numpy) is the parent's RSS cross-check's business where it runs (observed()).
"""
from __future__ import annotations

import math

from ...units import fmt_bytes
from .common import (Traits, BOOL, INT, NUM, STR, CommonSettings, WrongAnswer, fail, list_of, malformed, memory_lines,
                     host_meter, observed_unless_host, optional, passed, ranks_lines, rel, scale_settings, settings_class,
                     with_host)


@settings_class
class Settings(CommonSettings):
    MODEL_NAME: str                          # the learner module's MODEL_NAME, set by the harness to this scale's preset
    max_model_multiple: float | None = None  # device peak <= this x the final model's bytes (absolute, from the trusted run)
    max_host_multiple: float | None = None   # host memory held at once <= this x the final model's bytes (None: not judged)


TRAITS = Traits()
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def scenario(h):
    from vramlab.models import count_params

    torch = h.torch
    count_params(h.job.model)      # import the model's code now (lazy imports touch os.environ)

    def run(fn):
        meter = host_meter(h)
        h.reset_peak()
        with meter:
            model = h.call(lambda: fn(h.dev))
        peak = h.peak()
        if not isinstance(model, torch.nn.Module):
            raise WrongAnswer(f"load_model 应当返回模型（torch.nn.Module），实际返回了 {type(model).__name__}")
        params = list(model.parameters())
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                    for t in [*params, *model.buffers()]}
        return {"peak_bytes": peak, "model_bytes": sum(storages.values()), "param_count": sum(p.numel() for p in params),
                "dtypes": sorted({str(p.dtype) for p in params}), "on_device": all(h.tracked(p) for p in params),
                "fingerprint": h.fingerprint(params), "host_peak_bytes": meter.peak}
    return run


# host_peak_bytes: absent from payloads recorded before the host meter; like every field, a claim
PAYLOAD = dict(peak_bytes=INT, param_count=INT, dtypes=list_of(STR, 64), on_device=BOOL, fingerprint=list_of(NUM),
               host_peak_bytes=optional(INT))


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    why = malformed(sp, **PAYLOAD)
    if why:
        return fail(result, "tamper", why)
    peak, base_peak, model_bytes = sp["peak_bytes"], int(bp["peak_bytes"]), int(bp["model_bytes"])
    err = rel(sp["fingerprint"], bp["fingerprint"]) if len(sp["fingerprint"]) == len(bp["fingerprint"]) else math.inf
    result.update(peak_bytes=peak, ratio=round(peak / base_peak, 4) if base_peak else None, update_rel_err=err,
                  host_peak_bytes=sp.get("host_peak_bytes"))
    problems = [
        (sp["dtypes"] != ["torch.bfloat16"], f"参数的 dtype 是 {sp['dtypes']}，要求全部是 torch.bfloat16"),
        (not sp["on_device"], "有参数不在设备上（显存里）：模型要放在 device.torch_device 上"),
        (sp["param_count"] != bp.get("param_count"), "参数个数与起始代码的模型不同：用同一个预设"),
        (not err <= spec.rtol, f"参数值与起始代码的模型不同（相对误差 {err:.3g}，允许 {spec.rtol:g}）：用同样的预设和随机种子"),
    ]
    why = [msg for bad, msg in problems if bad]
    result["correct"] = not why
    if why:
        return fail(result, "incorrect", why[0])
    if peak < model_bytes:
        return fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于模型本身的大小 {fmt_bytes(model_bytes)}：显存计量被绕过了")
    settings = scale_settings(spec, result)
    multiple = settings.max_model_multiple or math.inf
    if peak > multiple * model_bytes or peak > spec.target_ratio * base_peak:
        return fail(result, "too_much_memory", f"加载时的峰值 {fmt_bytes(peak)} 是最终 bf16 模型（{fmt_bytes(model_bytes)}）的 "
                                               f"{peak / model_bytes:.2f} 倍、起始代码（{fmt_bytes(base_peak)}）的 {peak / base_peak:.2f} 倍；"
                                               f"目标：不超过模型的 {multiple:.2f} 倍，且不超过起始代码的 {spec.target_ratio:.2f} 倍")
    host, host_multiple = sp.get("host_peak_bytes"), settings.max_host_multiple
    if host is None:
        host_multiple = None
    if host_multiple is not None and host > host_multiple * model_bytes:
        return fail(result, "too_much_memory", f"这一题主存也有上限：加载期间主存里同时占着 {fmt_bytes(host)}，是最终 bf16 模型"
                                               f"（{fmt_bytes(model_bytes)}）的 {host / model_bytes:.2f} 倍；目标：主存也不超过模型的 "
                                               f"{host_multiple:.2f} 倍。主存里是不是同时放着整个模型的一份更大的副本？")
    host_text = f"，主存最多占模型的 {host / model_bytes:.2f} 倍" if host_multiple is not None else ""
    return passed(spec, result, f"峰值是 bf16 模型本身的 {peak / model_bytes:.2f} 倍（起始代码的 {result['ratio']:.2f} 倍）"
                                f"{host_text}，参数与起始代码一致")


def criteria_zh(spec) -> list[str]:
    lines = [*ranks_lines(spec), "- **正确**：返回模型的参数与起始代码的结果相同，全部是 bf16、在设备上；"]
    multiple = spec.ci.settings.max_model_multiple
    if multiple:
        lines.append(f"- **显存不多占**：加载期间的显存峰值 ≤ 最终模型大小的 **{multiple:g} 倍**；")
    host = spec.ci.settings.max_host_multiple
    if host is not None:
        lines.append(f"- **主存也不多占**：加载期间任一时刻留在主存（CPU 内存）里的张量之和 ≤ 最终模型大小的 **{host:g} 倍**"
                     "（模拟设备上，主存张量是在 `with device.host():` 里创建的张量；真 GPU 上是 CPU 上的张量）；")
    return lines + memory_lines(spec)
