"""Kind "max_batch": `find_max_batch(model, optimizer, make_batch, device)` on a virtual card (ch13).

The harness builds the model and a fresh AdamW (its state does not exist yet: it is created at the
first `optimizer.step()`), shrinks the device to a card of `budget_mib`, then calls the learner's
function. `make_batch(n)` gives n rows of token ids on the device; the learner writes the probe
(a training step), catches torch.OutOfMemoryError, frees what the failed attempt holds, and
searches. A trial is a run of the model on one batch size (consecutive runs at the same size count
once), seen by a pre-hook on the input embedding; it is marked done when the grader's optimizer
completed a step during it.

The truth comes from the trusted run: after the starter returns, the harness takes one step at
batch 1 (the optimizer state now exists), then a linear search with full steps (2, 3, ... until
the first OOM), checked here to be one. The learner's answer must equal it, found with at most
max_trials(answer) trials. What the learner's process reports (its own re-check, its trials) is
a claim. A search whose probe leaves out the optimizer step over-estimates; one that keeps the
failed attempt's tensors alive under-estimates.
"""
from __future__ import annotations

import math

from .common import (Traits, BOOL, INT, BaselineBroken, CommonSettings, WrongAnswer, fail, list_of, malformed,
                     pair, passed, settings_class, with_host)


@settings_class
class Settings(CommonSettings):
    budget_mib: float              # the virtual card, set before the learner's first step
    max_batch_allowed: int         # make_batch refuses larger batches


TRAITS = Traits(
    judged_zh="答案与试探次数", starter_problem_zh="直接返回 1：一定放得下，但不是最大的", report="answer", timeline_only=True,
    scale_zh="模型 `{model}`，序列长度 {seq}", oom_where_zh="搜索过程中（异常没有被接住）",
    how_graded_zh=(
        "1. 从上到下运行所有单元格。起始代码直接返回 1：一定放得下，但不是最大的。直接修改下面的函数。",
        "2. 最后一个单元格调用 `vramlab.check(\"{id}\")`：它在一个**独立的子进程**里建好模型、"
        "把设备缩成一块虚拟显卡，再运行你的函数，并亲自复查答案。",
        "3. 虚拟显卡的大小在同一次评分里、同一后端上确定，所以在任何 GPU 上、在 CPU 上的模拟设备上都成立。",
    ))
PERMISSIONS: frozenset[str] = frozenset({"empty_cache"})     # part of the OOM clean-up the chapter teaches
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
    seq, largest = h.job.seq, settings.max_batch_allowed
    vocab = int(h.job.config.get("vocab_size") or 64)
    trials: list[list] = []             # [batch, completed an optimizer step]
    watching = [False]

    def on_embed(module, args):
        ids = args[0] if args else None
        if watching[0] and isinstance(ids, torch.Tensor) and ids.dim() == 2:
            n = int(ids.shape[0])
            if not trials or trials[-1][0] != n:
                trials.append([n, False])

    def on_step(opt, args, kwargs):
        if watching[0] and trials:
            trials[-1][1] = True

    model.get_input_embeddings().register_forward_pre_hook(on_embed)
    optimizer.register_step_post_hook(on_step)

    def ids(n: int):
        with dev.host():
            t = torch.randint(0, vocab, (n, seq), generator=h.gen)
        return dev.to_device(t)

    def make_batch(n) -> "torch.Tensor":
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= largest:
            raise ValueError(f"make_batch 的参数要是 1 到 {largest} 之间的整数，收到 {n!r}")
        return ids(n)

    def fits(n: int) -> bool:
        """Trusted: one full training step at batch n, everything it made released afterwards."""
        loss, ok = None, True
        try:
            batch = ids(n)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
        except torch.OutOfMemoryError:
            ok = False
        batch = loss = None
        optimizer.zero_grad(set_to_none=True)
        return ok

    dev.set_budget(int(float(settings.budget_mib) * 2 ** 20))

    def run(fn):
        watching[0] = True
        try:
            answer = h.call(lambda: fn(model, optimizer, make_batch, dev))
        finally:
            watching[0] = False
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise WrongAnswer(f"find_max_batch 应当返回整数，实际返回了 {answer!r}")
        out = {"trials": trials, "peak_bytes": h.peak()}
        if h.job.reference:      # the truth: a trusted linear search with full steps
            fits(1)                                    # the optimizer state exists from here on
            n, truth_trials = 2, []
            while n <= largest and fits(n):
                truth_trials.append([n, True])
                n += 1
            truth_trials.append([n, False])
            verified = n <= largest and fits(n - 1) and not fits(n)
            return dict(out, answer=n - 1, trials=truth_trials, verified=bool(verified), starter_answer=answer)
        verified = 1 <= answer < largest and fits(answer) and not fits(answer + 1)
        return dict(out, answer=answer, verified=bool(verified))
    return run


def trusted_answer(bp: dict) -> int:
    """The truth of the trusted run, once its trials show a linear search that found it: every batch
    up to the answer fitted, answer + 1 did not, and the harness's own re-check agreed."""
    answer, trials = bp.get("answer"), bp.get("trials") or []
    linear = [[n, True] for n in range(2, (answer or 0) + 1)] + [[(answer or 0) + 1, False]]
    if not isinstance(answer, int) or answer < 1 or not bp.get("verified") or [list(t) for t in trials] != linear:
        raise BaselineBroken(f"可信的线性搜索结果不自洽：答案 {answer!r}，试探 {trials[:10]!r}")
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
    tried = f"{tried or '无'}（✓：这个 batch 完成了一次优化器更新）"
    if not result["correct"]:
        side = ("偏大：评分器用完整的训练步复查，它放不下" if answer > truth else
                "偏小：评分器用完整的训练步复查，更大的 batch 也放得下")
        return fail(result, "incorrect", f"返回的 batch = {answer} 不是最大能放下的 batch，{side}。"
                                         f"你试过的 batch：{tried}")
    if len(trials) > allowed:
        return fail(result, "too_many_trials", f"试了 {len(trials)} 个 batch，最多允许 {allowed} 个。"
                                               f"你试过的 batch：{tried}")
    return passed(spec, result, f"最大 batch = {answer}，试了 {len(trials)} 个 batch（允许 {allowed} 个）：{tried}")


def criteria_zh(spec) -> list[str]:
    return ["- **答案对**：返回的 batch 用完整的训练步（前向、反向、优化器更新）放得下，再加 1 就放不下"
            "（评分器在你返回后亲自复查）；",
            "- **试得少**：试过的不同 batch 个数不超过 2·⌈log₂(答案 + 1)⌉ + 2 个（连续几次用同一个 batch 算一个）；",
            "- 放不下时抛出 `torch.OutOfMemoryError`；评分器只在你返回之后复查，在那之前显存怎么用都由你的代码负责。"]
