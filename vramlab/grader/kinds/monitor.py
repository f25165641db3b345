"""Kind "monitor": `measure_peak(fn, device)` returns the peak (absolute `max_allocated`) while
`fn()` runs (ch02).

Three hidden functions, sized from the job's `case_seed` (drawn afresh for every grading, the same
for both children): one frees what it allocates, one keeps its output, one training step. Each
child measures the truth of a function itself right before the learner's code measures it; the
judge compares the learner's answers with the truths of the TRUSTED child.
"""
from __future__ import annotations

from ...units import fmt_bytes
from .common import (Traits, how_graded_against_measurement_zh, INT, NUM, STR, BaselineBroken, CommonSettings, fail, list_of, malformed, observed_unless_host,
                     passed, record, settings_class, with_host, worst_case)


@settings_class
class Settings(CommonSettings):
    pass


_STARTER_PROBLEM_ZH = "能运行，但量出的峰值不对"
TRAITS = Traits(judged_zh="测量误差", starter_problem_zh=_STARTER_PROBLEM_ZH, memory_view=False, report="error",
                fresh_case_seed=True, how_graded_zh=how_graded_against_measurement_zh(_STARTER_PROBLEM_ZH))
PERMISSIONS: frozenset[str] = frozenset({"reset_peak"})     # measure_peak resets the peak: that is the lesson
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def scenario(h):
    import random

    torch, dev = h.torch, h.dev
    model, optimizer = h.training_setup()
    batch = h.tokens((h.job.batch, h.job.seq))
    rng = random.Random(h.job.case_seed)
    mib = 2 ** 20 // 4                                # float32 elements per MiB
    kept: list = []

    def train():
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def transient(a=rng.randint(8, 24) * mib, b=rng.randint(4, 12) * mib):
        x = torch.ones(a, device=dev.torch_device)
        y = torch.ones(b, device=dev.torch_device) * 2
        return float(x[0] + y[0])                     # both freed on return

    def keeps(a=rng.randint(6, 20) * mib, b=rng.randint(10, 30) * mib):
        kept.append(torch.zeros(a, device=dev.torch_device))     # stays allocated after fn returns
        return float(torch.ones(b, device=dev.torch_device).sum())

    train()                                           # optimizer state exists: the steady state
    cases = [("transient", transient), ("keeps_output", keeps), ("train_step", train)]
    spike = (rng.randint(40, 60) * mib,)

    def run(fn):
        out = []
        for name, f in cases:
            # The truth and the learner's reading start from the same allocator cache: one round of
            # (f, spike) first leaves every segment both need cached, and each later round returns
            # the cache to that state. A caching allocator charges a block at the size it hands
            # out, so the same code read from another cache state can differ by a block (1 MiB,
            # about 1% here: the whole tolerance).
            f()
            kept.clear()
            torch.empty(spike, device=dev.torch_device)
            h.reset_peak()
            f()
            truth = h.peak()
            kept.clear()
            torch.empty(spike, device=dev.torch_device)   # a stale, higher peak: measure_peak must reset it
            calls = []
            got = h.call(lambda: float(fn(lambda: calls.append(1) or f(), dev)))
            kept.clear()
            if len(calls) != 1:
                h.violate("skipped_work", f"measure_peak 调用 fn() 的次数是 {len(calls)}，应当恰好一次")
            out.append({"case": name, "truth": truth, "got": got})
        return {"answers": out, "peak_bytes": max(c["truth"] for c in out)}
    return run


ANSWER = record(case=STR, truth=INT, got=NUM)


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    trusted = bp.get("answers") or []
    if not trusted:
        raise BaselineBroken("可信基线没有给出隐藏函数的实测峰值")
    why = malformed(sp, answers=list_of(ANSWER, len(trusted)))
    if why:
        return fail(result, "tamper", why)
    answers = sp["answers"]
    if [a["case"] for a in answers] != [b["case"] for b in trusted]:
        return fail(result, "tamper", "结果文件的格式不对：隐藏函数的顺序或名字与可信进程的不同")
    if any(a["truth"] < 0.99 * b["truth"] for a, b in zip(answers, trusted)):
        return fail(result, "tamper", "评分器测得的峰值低于可信进程里同一个函数的峰值：显存计量被绕过了")
    truths = [b["truth"] for b in trusted]            # the truth is the trusted child's, never the learner's
    i = worst_case(result, [a["got"] for a in answers], truths, spec.target_ratio)
    if result["correct"]:
        return passed(spec, result, f"{len(answers)} 个隐藏函数的峰值都测准了（最大相对误差 {result['ratio']:.2%}）")
    left = ("。你的函数在调用之间留下了张量，之后的峰值都变高了"
            if any(a["truth"] > 1.01 * b["truth"] for a, b in zip(answers, trusted)) else "")
    got, truth = result["peak_bytes"], result["baseline_peak_bytes"] or 0
    # which way it is off says what was missed; the feedback points at the cause, not at the API
    why = ("你的读数偏高：是不是读到了 fn 运行之前留下的更早、更高的峰值？" if got is not None and got > truth else
           "你的读数偏低：fn 运行中途出现、返回之前又释放的张量算进去了吗？调用之前已经占用的显存（参数、优化器状态）呢？")
    return fail(result, "incorrect", f"隐藏函数 {trusted[i]['case']}：你返回 {fmt_bytes(got or 0)}，"
                                     f"它运行期间的峰值是 {fmt_bytes(truth)}，"
                                     f"允许误差 {spec.target_ratio:.0%}{left}。{why}")


def criteria_zh(spec) -> list[str]:
    pct = f"{spec.target_ratio * 100:g}%"
    return [f"- **量得准**：每个隐藏函数，你返回的峰值与评分器测得的峰值相差不超过 **{pct}**；",
            "- `fn` 恰好调用一次。"]
