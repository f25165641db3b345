"""Kind "estimate": `estimate_static_bytes(n_params, optimizer, precision)` is arithmetic (ch01).

The trusted (reference) child measures the truth of every case on the simulated device: one real
training step, then parameters + gradients + optimizer state of the breakdown just before
zero_grad. The learner's child only asks the function, which gets no device and must not create
tensors on this one. Every estimate must be within target_ratio (relative) of the trusted truth.
"""
from __future__ import annotations

from .common import (Traits, how_graded_against_measurement_zh, NUM, BaselineBroken, CommonSettings, fail, list_of, malformed, passed, scale_settings,
                     settings_class, worst_case)


@settings_class
class Settings(CommonSettings):
    cases: tuple[tuple[str, str, str, bool], ...]   # (preset, optimizer, precision, measure under FakeTensorMode)
    visible: int = 0                                # the first `visible` cases are public: failures show the truth


_STARTER_PROBLEM_ZH = "能运行，但算出的字节数不对"
TRAITS = Traits(judged_zh="估算误差", starter_problem_zh=_STARTER_PROBLEM_ZH, memory_view=False, report="error",
                how_graded_zh=how_graded_against_measurement_zh(_STARTER_PROBLEM_ZH))
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = False           # no memory work: nothing for the parent's RSS cross-check to compare


def permissions(settings: Settings) -> frozenset[str]:
    return PERMISSIONS


def observed(settings: Settings) -> bool:
    return OBSERVED


def _static_truth(torch, model_name: str, optimizer: str, precision: str, fake: bool) -> tuple[int, int]:
    """(parameter count, parameters + gradients + optimizer state in bytes) on a fresh simulated
    device, read from its breakdown after one real training step, just before zero_grad."""
    from vramlab.models import build_model
    from vramlab.sim.device import SimDevice

    with SimDevice(fake=fake, timeline=False) as d:
        model = build_model(model_name, dtype=torch.bfloat16 if precision == "bf16" else None)
        params = list(model.parameters())
        opt = {"sgd": lambda: torch.optim.SGD(params, lr=1e-3),
               "sgdm": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
               "adamw": lambda: torch.optim.AdamW(params, lr=1e-3)}[optimizer]()
        ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        b = d.breakdown(at_peak=False)
        opt.zero_grad(set_to_none=True)
        return sum(p.numel() for p in params), b["parameters"] + b["gradients"] + b["optimizer_state"]


def scenario(h):
    from vramlab.models import count_params

    cases = h.settings.cases
    truths = None
    if h.job.reference:
        with h.dev.untracked():
            truths = [_static_truth(h.torch, *c) for c in cases]
    sizes = {name: count_params(name) for name in {c[0] for c in cases}}

    def run(fn):
        answers = []
        for name, optimizer, precision, _ in cases:
            before = h.dev.allocated()
            h.reset_peak()
            answers.append(h.call(lambda: float(fn(sizes[name], optimizer, precision))))
            if h.peak() > before:
                h.violate("tensor_work", "estimate_static_bytes 在（模拟）显存上创建了张量：本题要求直接用公式算出字节数，"
                                         "不要在函数里建模型或测量")
        return {"cases": [[sizes[c[0]], c[1], c[2]] for c in cases], "answers": answers,
                "truths": [t for _, t in truths] if truths else None}
    return run


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    cases, truths = bp.get("cases") or [], bp.get("truths") or []
    if not truths or len(truths) != len(cases):
        raise BaselineBroken(f"可信基线没有给出每个用例的实测值：{len(truths)} 个实测值，{len(cases)} 个用例")
    why = malformed(sp, answers=list_of(NUM, len(truths)))
    if why:
        return fail(result, "tamper", why)
    i = worst_case(result, sp["answers"], truths, spec.target_ratio)
    if result["correct"]:
        return passed(spec, result, f"所有 {len(cases)} 个用例的估算都在实测值的 ±{spec.target_ratio:.0%} 以内"
                                    f"（最大相对误差 {result['ratio']:.2%}）")
    n, opt, prec = cases[i] if i < len(cases) else ("?", "?", "?")
    visible = i < scale_settings(spec, result).visible
    truth = f"，实测 {result['baseline_peak_bytes']:,} 字节" if visible else "（隐藏用例，不公布实测值）"
    err = f"{result['ratio']:.1%}" if result["ratio"] is not None else "无穷大（返回值不是有限的数）"
    # a hidden case names neither its parameter count nor the truth: nothing to copy into a lookup table
    case = (f"n_params={n:,}、" if visible and isinstance(n, int) else "") + f"optimizer={opt!r}、precision={prec!r}"
    answer = f"你的估算 {result['peak_bytes'] or 0:,} 字节" if visible else "你的估算"
    return fail(result, "incorrect", f"{case}：{answer}{truth}，相对误差 {err}，允许 {spec.target_ratio:.0%}")


def criteria_zh(spec) -> list[str]:
    pct = f"{spec.target_ratio * 100:g}%"
    return [f"- **估得准**：每个用例的估算与模拟设备实测的字节数相差不超过 **{pct}**；",
            "- **用公式算**：函数拿不到设备，也不能创建张量去测量。"]
