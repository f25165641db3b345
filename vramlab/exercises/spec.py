"""One exercise = one spec. The learner notebook (exercises/), the reference solution (solutions/),
the grader and the course page are all generated from, or check against, this one object.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scale:
    """A workload size: `ci` runs in seconds on a CPU (simulated device); `gpu` is sized for a real card."""
    model: str                     # vramlab.models preset
    batch: int
    seq: int
    steps: int = 3                 # optimizer steps; the peak is measured after `warmup` of them
    warmup: int = 1
    extra: dict = field(default_factory=dict)   # exercise-specific knobs (e.g. micro_batch, budget)


@dataclass(frozen=True)
class ExerciseSpec:
    id: str                        # e.g. "ch07-checkpoint"
    chapter: int
    title: str                     # Chinese
    task: str                      # Chinese markdown: what to do and why
    function: str                  # name of the function the learner writes
    signature: str                 # e.g. "def train_step(model, optimizer, batch, device):"
    starter: str                   # full source of the starter function: correct, but too much memory
    solution: str                  # full source of the reference solution
    ci: Scale
    gpu: Scale
    target_ratio: float            # pass if peak <= target_ratio * starter peak (same run, same backend)
    rtol: float = 1e-4             # correctness: losses/parameters vs the starter's after the steps
    atol: float = 1e-5
    update_rtol: float = 1e-3      # correctness: ||update - starter's update|| / ||starter's update||
                                   # (updates compared through fixed random projections per tensor)
    technique: str | None = None   # required technique, checked by counting calls in the harness:
                                   # "accumulation" (>= 2 model forwards per step), "autocast"
                                   # (forward under autocast), "checkpoint" (blocks recomputed)
    max_time_ratio: float | None = None   # optional: step time <= this x the starter's
    points: int = 10
    hints: tuple[str, ...] = ()    # Chinese: what to try next when it fails
    metric: str = "steady_peak_allocated"
    kind: str = "train_step"       # what the harness runs and how core.py judges it:
    # "train_step"  train_step(model, optimizer, batch, device); peak ratio vs the starter + same results
    # "train_epoch" train_epoch(model, optimizer, tokens, device, batch_size) over a HOST dataset; same judge
    # "estimate"    estimate_static_bytes(n_params, optimizer, precision): within target_ratio (relative)
    #               of the static bytes the sim measures; ratio = worst relative error
    # "monitor"     measure_peak(fn, device) on hidden functions: within target_ratio of the harness's
    #               own peak; ratio = worst relative error
    # "load"        load_model(device): bf16 model equal to the starter's; peak <= target_ratio x the
    #               starter's and <= extra["max_model_multiple"] x the model's own bytes
    # "call"        one call on prepared inputs (extra["case"], vramlab.grader.scenarios.CALL_CASES): the same
    #               outputs as the starter (rtol) and `metric` <= target_ratio x the starter's
    # "max_batch"   find_max_batch(try_step, device) on a virtual card: the answer fits and answer + 1 does
    #               not; at most core.max_trials(answer) trials (ratio = trials / allowed, target 1.0)
    # "distill_step" distill_step(student, teacher, optimizer, batch, device): the train_step judge on the
    #               student; the teacher (extra["teacher_config"]) must come back unchanged
    # "finetune"    prepare_model(model) -> the model the grader then trains (AdamW over requires_grad
    #               parameters): extra["method"] (peft), trainable share <= extra["max_trainable_share"],
    #               the loss goes down (and starts equal when extra["same_start"]), peak <= target x the
    #               starter's (full fine-tuning)
    # extra["learner_budget_mib"] (train_step) puts the learner's run on a virtual card of that size; the
    #               trusted starter runs without it (it need not fit) and only gives the baseline
    # extra["world_size"] > 1 runs that many ranks over gloo (train_step and call); the worst rank's peak counts


def plain_train_step(doc: str) -> str:
    """The plain training step (forward, backward, step, zero_grad): the starter of every exercise
    whose lesson is "same step, less memory"; `doc` says what is wrong with it in that chapter."""
    lines = "\n    ".join(doc.strip().splitlines())
    return f'''import torch


def train_step(model, optimizer, batch, device):
    """{lines}"""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''


def criteria_zh(spec: ExerciseSpec) -> list[str]:
    """The pass criteria in Chinese, one Markdown bullet each: the notebook intro and the chapter
    page both print these, so what learners read is what the grader checks."""
    pct = f"{spec.target_ratio * 100:g}%"
    if spec.kind == "estimate":
        return [f"- **估得准**：每个用例（公开的和隐藏的）与模拟设备实测的字节数相差不超过 **{pct}**；",
                "- **用公式算**：函数拿不到设备，也不能创建张量去测量。"]
    if spec.kind == "monitor":
        return [f"- **量得准**：每个隐藏函数，你返回的峰值与评分器测得的峰值相差不超过 **{pct}**；",
                "- `fn` 恰好调用一次。"]
    if spec.kind == "max_batch":
        return ["- **答案对**：返回的 batch 能放下，再加 1 就放不下（评分器在你返回后亲自复查）；",
                "- **试得少**：调用 `try_step` 的次数不超过 2·⌈log₂(答案 + 1)⌉ + 2 次（先翻倍、再二分）；",
                "- 放不下时 `try_step` 抛出 `torch.OutOfMemoryError`：接住它，进程要一直可用。"]
    lines = []
    ranks = spec.ci.extra.get("world_size", 1)
    if ranks > 1:
        lines.append(f"- **多进程**：评分器启动 {ranks} 个 rank（gloo），每个 rank 分别检查，峰值取各 rank 中最大的；")
    if spec.kind == "finetune":
        method = {"lora": "LoRA", "dora": "DoRA（`use_dora=True`）", "prompt_tuning": "Prompt Tuning",
                  "prefix_tuning": "P-Tuning v2（Prefix Tuning）"}[spec.ci.extra["method"]]
        share = spec.ci.extra.get("max_trainable_share", 0.1)
        lines.append(f"- **方法对**：返回用 peft 的 {method} 包装的模型，可训练参数不超过全部参数的 {share:.0%}；")
        lines.append("- **在学习**：评分器训练几步后损失要下降" +
                     ("，且第 1 步的损失与全量微调相同（适配器初始是恒等变换）；" if spec.ci.extra.get("same_start") else "；"))
        lines.append(f"- **省显存**：训练的峰值显存 ≤ 全量微调（起始代码）峰值的 **{pct}**（同一次运行、同一后端上测得）。")
        return lines
    if spec.kind == "load":
        multiple = spec.ci.extra.get("max_model_multiple")
        lines.append("- **正确**：返回模型的参数与起始代码的结果相同，全部是 bf16、在设备上；")
        if multiple:
            lines.append(f"- **不多占**：加载期间的峰值 ≤ 最终模型大小的 **{multiple:g} 倍**；")
    elif spec.kind == "call":
        lines.append(f"- **正确**：返回的结果与起始代码一致（相对误差 ≤ {spec.rtol:g}）；")
    else:
        who = "学生模型的" if spec.kind == "distill_step" else ""
        lines.append(f"- **正确**：损失与{who}更新后的参数和起始代码一致（`rtol={spec.rtol:g}`，`atol={spec.atol:g}`）；")
        if spec.kind == "distill_step":
            lines.append("- **教师不变**：教师模型的参数在评分前后完全相同；")
    if spec.metric == "reserved_gap":
        lines.append(f"- **少碎片**：已保留峰值 − 已分配峰值（`max_memory_reserved − max_memory_allocated`）≤ 起始代码的 "
                     f"**{pct}**，且已保留峰值不高于起始代码（同一次运行、同一后端上测得）；")
        lines.append("- 不许调用 `empty_cache()`。")
    else:
        lines.append(f"- **省显存**：峰值显存 ≤ 起始代码峰值的 **{pct}**（同一次运行、同一后端上测得）。")
    if spec.max_time_ratio is not None:
        lines.append(f"- **不太慢**：每步时间 ≤ 起始代码的 {spec.max_time_ratio:g} 倍。")
    budget = spec.ci.extra.get("learner_budget_mib")
    if budget:
        lines.append(f"- **装得下**：你的代码在 {budget:g} MiB 的虚拟显卡上运行（CI 规模），任何一步都不能 OOM；"
                     "起始代码在这张卡上放不下，它只在不限显存的情况下运行，作为对照。")
    return lines


# The starter of the peft exercises (kind "finetune"): train every parameter.
FULL_FINETUNE = '''import torch


def prepare_model(model):
    """全量微调：原样返回模型，所有参数都训练。
    每个参数都要有梯度和 AdamW 的两个状态：FP32 下每个参数 16 字节。"""
    return model
'''

# The model of the peft exercises at ci scale: a 4-layer Llama (GQA, SwiGLU, RMSNorm) whose model
# states, not its activations, dominate a short batch: what parameter-efficient fine-tuning is for.
FINETUNE_CI_CONFIG = {"num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 688,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


def finetune_exercise(*, id: str, chapter: int, title: str, task: str, solution: str, method: str,
                      same_start: bool, target_ratio: float, hints: tuple[str, ...],
                      max_trainable_share: float = 0.1) -> ExerciseSpec:
    """A peft exercise (ch24-27): `prepare_model(model)` against full fine-tuning, on llama-tiny
    enlarged at ci scale and Llama-3.2-1B's shape on a GPU. `task` is the method-specific part; the
    contract (what the grader does with the returned model) is the same for all and stated here."""
    extra = {"method": method, "same_start": same_start, "max_trainable_share": max_trainable_share}
    contract = ("`prepare_model(model)` 拿到评分器建好的 Llama 模型（随机权重，已经在设备上，所有参数 "
                "`requires_grad=True`），返回要训练的模型。评分器随后**只为 `requires_grad=True` 的参数**创建 AdamW，"
                "在固定的数据上训练几步，测稳态峰值。起始代码原样返回模型，也就是全量微调。\n\n")
    return ExerciseSpec(
        id=id, chapter=chapter, title=title, task=contract + task, function="prepare_model",
        signature="def prepare_model(model):", starter=FULL_FINETUNE, solution=solution,
        ci=Scale(model="llama-tiny", batch=2, seq=64, steps=4, warmup=1,
                 extra=dict(extra, cublas_workspace=False, config=FINETUNE_CI_CONFIG)),
        gpu=Scale(model="llama-1b", batch=4, seq=512, steps=4, warmup=1, extra=extra),
        target_ratio=target_ratio, points=10, kind="finetune", hints=hints)
