"""Kind "max_batch": `find_max_batch(try_step, device)` on a virtual card (ch13). `try_step(n)` runs
one training step at batch n (trusted code) and raises torch.OutOfMemoryError when it does not fit.

The truth is the trusted starter's answer: its linear search (2, 3, ... until the first OOM) is
checked here to be one. The learner's answer must equal it, found with at most max_trials(answer)
calls of try_step. What the learner's process reports (its own re-check, its trials) is a claim.
"""
from __future__ import annotations

import math

from .common import (BOOL, INT, BaselineBroken, CommonSettings, WrongAnswer, fail, list_of, malformed,
                     pair, passed, settings_class, with_host)


@settings_class
class Settings(CommonSettings):
    budget_mib: float              # the virtual card, set after one step at batch 1 (the optimizer state exists)
    max_batch_allowed: int         # try_step refuses larger batches


PERMISSIONS: frozenset[str] = frozenset()
# A trial that does not fit has already allocated its tensor in host RAM when the simulated card
# refuses it: the process's memory grows with the largest batch tried, not with the device peak.
OBSERVED = False


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED


def max_trials(answer: int) -> int:
    """Trials a doubling-then-bisection search needs for an answer (and a little slack)."""
    return 2 * max(1, math.ceil(math.log2(answer + 1))) + 2


def scenario(h):
    torch, dev = h.torch, h.dev
    settings = h.settings
    model, optimizer = h.training_setup()
    seq, largest = int(h.job["seq"]), settings.max_batch_allowed
    vocab = int((h.job.get("config") or {}).get("vocab_size") or 64)
    trials: list[tuple[int, bool]] = []

    def step(n: int) -> float:
        with dev.host():
            ids = torch.randint(0, vocab, (n, seq), generator=h.gen)
        loss = None
        try:
            batch = dev.to_device(ids)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            return float(loss.detach())
        finally:
            optimizer.zero_grad(set_to_none=True)
            del loss

    def try_step(batch_size) -> float:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= largest:
            raise ValueError(f"try_step 的 batch_size 要是 1 到 {largest} 之间的整数，收到 {batch_size!r}")
        try:
            value = step(batch_size)
        except torch.OutOfMemoryError:
            trials.append((batch_size, False))
            raise
        trials.append((batch_size, True))
        return value

    def fits(n: int) -> bool:
        try:
            step(n)
            return True
        except torch.OutOfMemoryError:
            return False

    step(1)                                            # the optimizer state exists before the budget
    dev.set_budget(int(float(settings.budget_mib) * 2 ** 20))

    def run(fn):
        answer = h.call(lambda: fn(try_step, dev))
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise WrongAnswer(f"find_max_batch 应当返回整数，实际返回了 {answer!r}")
        verified = 1 <= answer < largest and fits(answer) and not fits(answer + 1)
        return {"answer": answer, "verified": bool(verified), "trials": trials, "peak_bytes": h.peak()}
    return run


def trusted_answer(bp: dict) -> int:
    """The starter's answer, once its trials show a linear search that found it: every batch up to
    the answer fitted, answer + 1 did not, and the harness's own re-check agreed."""
    answer, trials = bp.get("answer"), bp.get("trials") or []
    linear = [[n, True] for n in range(2, (answer or 0) + 1)] + [[(answer or 0) + 1, False]]
    if not isinstance(answer, int) or answer < 1 or not bp.get("verified") or [list(t) for t in trials] != linear:
        raise BaselineBroken(f"起始代码的线性搜索结果不自洽：答案 {answer!r}，试探 {trials[:10]!r}")
    return answer


PAYLOAD = dict(answer=INT, trials=list_of(pair(INT, BOOL)), peak_bytes=INT, verified=BOOL)


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    truth = trusted_answer(bp)
    why = malformed(sp, **PAYLOAD)
    if why:
        return fail(result, "tamper", why)
    answer, trials = sp["answer"], sp["trials"]
    allowed = max_trials(max(answer, 1))
    result.update(peak_bytes=sp["peak_bytes"], ratio=round(len(trials) / allowed, 4), correct=answer == truth,
                  answer=answer, trials=len(trials), allowed_trials=allowed, baseline_answer=truth)
    tried = "、".join(f"{n}{'✓' if ok else '✗'}" for n, ok in trials[:40])
    if not result["correct"]:
        return fail(result, "incorrect", f"返回的 batch = {answer} 不是最大能放下的 batch（要求 {answer} "
                                         f"能放下，{answer + 1} 放不下）。你试过的 batch：{tried or '无'}")
    if len(trials) > allowed:
        return fail(result, "too_many_trials", f"调用了 {len(trials)} 次 try_step，最多允许 {allowed} 次"
                                               f"（先翻倍、再二分）。你试过的 batch：{tried}")
    return passed(spec, result, f"最大 batch = {answer}，用了 {len(trials)} 次试探（允许 {allowed} 次）：{tried}")


def criteria_zh(spec) -> list[str]:
    return ["- **答案对**：返回的 batch 能放下，再加 1 就放不下（评分器在你返回后亲自复查）；",
            "- **试得少**：调用 `try_step` 的次数不超过 2·⌈log₂(答案 + 1)⌉ + 2 次（先翻倍、再二分）；",
            "- 放不下时 `try_step` 抛出 `torch.OutOfMemoryError`：接住它，进程要一直可用。"]
