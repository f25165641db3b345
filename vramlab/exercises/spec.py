"""One exercise = one spec. The learner notebook (exercises/), the reference solution (solutions/),
the grader and the course page are all generated from, or check against, this one object.

A spec holds what the learner may see (task, starter, hints) and what the grader keeps to itself
(the hidden cases); the reference solution is not in the package at all: it is the file
solutions/<id>/solution.py of the course repository, beside the nbgrader source notebook, which
`spec.solution` reads (an installed wheel has none: learners who pip-install vramlab get no answers).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..grader.kinds import finetune, get_kind


# $VRAMLAB_SOLUTIONS: another course folder's solutions/ (a grading node with a copy of the course)
SOLUTIONS_DIR = Path(os.environ.get("VRAMLAB_SOLUTIONS") or Path(__file__).resolve().parents[2] / "solutions")


def solution_file(exercise_id: str) -> Path:
    return SOLUTIONS_DIR / exercise_id / "solution.py"


def solution_source(exercise_id: str) -> str:
    """The reference solution's source; a Chinese FileNotFoundError where this copy has none."""
    path = solution_file(exercise_id)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"找不到 {exercise_id} 的参考答案 {path}：参考答案只在课程仓库的 solutions/ 里"
                                "（教师用），安装的 vramlab 包里没有；需要时把环境变量 VRAMLAB_SOLUTIONS 指向那个文件夹") from None


@dataclass(frozen=True)
class Variation:
    """A configuration the grader also runs, once the visible one passes, that the learner never
    sees: not in the notebook, the page or the feedback. Code tuned to the visible shapes or
    numbers fails it; a general solution passes. Unset fields keep the visible scale's values;
    `config` is merged into the kind's `settings.config`, `settings` replaces other Settings fields."""
    catches: str                   # developer note: what a solution fitted to the visible case gets wrong here
    batch: int | None = None
    seq: int | None = None
    seed: int | None = None
    steps: int | None = None       # more calls: a leak has more steps to grow (ch21)
    config: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def changes_zh(self) -> str:
        """Which dimensions differ, without their values (the feedback names no hidden number)."""
        names = [zh for attr, zh in (("batch", "批大小"), ("seq", "序列长度"), ("seed", "随机种子"), ("steps", "步数"))
                 if getattr(self, attr) is not None]
        names += [_KNOB_ZH.get(k, k) for k in (*self.config, *self.settings)]
        return "、".join(dict.fromkeys(names)) or "配置"


_KNOB_ZH = {"n_layer": "层数", "num_hidden_layers": "层数", "n_embd": "宽度", "hidden_size": "宽度",
            "n_head": "头数", "vocab_size": "词表", "lengths": "请求长度", "budget_mib": "显存预算",
            "d_model": "宽度", "heads": "头数", "kv_heads": "KV 头数", "head_dim": "每头维度", "hidden": "宽度",
            "layers": "层数", "experts": "专家数", "top_k": "top-k", "cases": "模型和优化器",
            "n_samples": "样本数", "d_in": "输入维度", "d_out": "输出维度", "n_batches": "批数",
            "visible": "模型和优化器", "MODEL_NAME": "模型", "softcap": "分数软上限",
            "vocab": "词表", "intermediate_size": "MLP 宽度", "num_attention_heads": "头数",
            "num_key_value_heads": "KV 头数", "learner_budget_mib": "显卡大小",
            "lr": "学习率", "teacher_config": "教师模型"}


@dataclass(frozen=True)
class Scale:
    """A workload size: `ci` runs in seconds on a CPU (simulated device); `gpu` is sized for a real card."""
    model: str                     # vramlab.models preset
    batch: int
    seq: int
    steps: int = 3                 # optimizer steps; the peak is measured after `warmup` of them
    warmup: int = 1
    settings: object = None        # the kind's Settings (vramlab.grader.kinds.<kind>.Settings); None: its defaults
    seed: int = 0                  # model weights and data
    hidden: tuple[Variation, ...] = ()    # graded too, never shown (Variation)

    def varied(self, v: Variation) -> "Scale":
        """This scale with a hidden variation applied (itself without hidden cases)."""
        settings = self.settings
        if v.config or v.settings:
            config = {**getattr(settings, "config", {}), **v.config}
            settings = replace(settings, **v.settings, **({"config": config} if v.config else {}))
        return replace(self, batch=v.batch or self.batch, seq=v.seq or self.seq, steps=v.steps or self.steps,
                       seed=self.seed if v.seed is None else v.seed, settings=settings, hidden=())


@dataclass(frozen=True)
class ExerciseSpec:
    id: str                        # e.g. "ch07-checkpoint"
    chapter: int
    title: str                     # Chinese
    task: str                      # Chinese markdown: what to do and why
    function: str                  # name of the function the learner writes
    signature: str                 # e.g. "def train_step(model, optimizer, batch, device):"
    starter: str                   # full source of the starter function: correct, but too much memory
    ci: Scale
    gpu: Scale
    target_ratio: float            # pass if peak <= target_ratio * starter peak (same run, same backend)
    rtol: float = 1e-4             # correctness: losses/parameters vs the starter's after the steps
    atol: float = 1e-5
    update_rtol: float = 1e-3      # correctness: ||update - starter's update|| / ||starter's update||
                                   # (updates compared through fixed random projections per tensor)
    technique: str | None = None   # train_step only: the technique observed while the learner trains
                                   # (vramlab.grader.kinds.technique): "accumulation" (>= 2 model
                                   # forwards per step), "autocast" (forward under autocast, fp32
                                   # parameters, gradients and optimizer state), "checkpoint" (block
                                   # forwards recomputed during backward, little saved inside blocks)
    max_time_ratio: float | None = None   # optional: step time <= this x the starter's
    points: int = 10
    hints: tuple[str, ...] = ()    # Chinese: what to try next when it fails
    metric: str = "steady_peak_allocated"
    kind: str = "train_step"       # what the harness runs and how the grader judges it: one module of
                                   # vramlab.grader.kinds per kind (its docstring says what it checks)
    giveaways: tuple[str, ...] = ()    # regexes of what solves it (an API, a line): the task, the
                                   # starter and every hint but the last must not contain them

    @property
    def solution(self) -> str:
        """Full source of the reference solution: solutions/<id>/solution.py (instructors' copy only)."""
        return solution_source(self.id)

    def __post_init__(self):
        kind = get_kind(self.kind)          # an unknown kind fails when the spec is built
        if self.technique and self.technique not in kind.TRAITS.techniques:
            raise ValueError(f"{self.id}: technique {self.technique!r} is not one kind {self.kind!r} observes "
                             f"({sorted(kind.TRAITS.techniques)})")
        for name in ("ci", "gpu"):
            scale = getattr(self, name)
            if scale.settings is None:
                object.__setattr__(self, name, replace(scale, settings=kind.Settings()))
            elif type(scale.settings) is not kind.Settings:
                raise TypeError(f"{self.id}: {name}.settings is {type(scale.settings).__module__}."
                                f"{type(scale.settings).__qualname__}, kind {self.kind!r} needs {kind.__name__}.Settings")


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


def plain_train_epoch(doc: str) -> str:
    """The plain epoch (the whole dataset moved to the device, then one step per batch): the starter
    of the exercises about data on the host (ch04, stage1-challenge); `doc` says what is wrong with it."""
    lines = "\n    ".join(doc.strip().splitlines())
    return f'''import torch


def train_epoch(model, optimizer, tokens, device, batch_size):
    """{lines}"""
    tokens = device.to_device(tokens)
    losses = []
    for i in range(0, tokens.shape[0], batch_size):
        batch = tokens[i:i + batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
'''


def criteria_zh(spec: ExerciseSpec) -> list[str]:
    """The pass criteria in Chinese, one Markdown bullet each: the notebook intro and the chapter
    page both print these, so what learners read is what the grader checks."""
    lines = get_kind(spec.kind).criteria_zh(spec)
    if spec.ci.hidden:
        lines.append(f"- 你看到的配置通过后，评分器还会在 {len(spec.ci.hidden)} 个**隐藏配置**上再评一次"
                     "（换模型的形状、数据的大小、显卡大小或随机种子之类，具体数值不公开），每个都要达到同样的标准："
                     "只对你看到的形状或数字成立的写法拿不到分。")
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


def finetune_exercise(*, id: str, chapter: int, title: str, task: str, method: str,
                      same_start: bool, target_ratio: float, hints: tuple[str, ...], giveaways: tuple[str, ...],
                      catches: str, cover: str = "", max_trainable_share: float = 0.1) -> ExerciseSpec:
    """A peft exercise (ch24-27): `prepare_model(model)` against full fine-tuning, on llama-tiny
    enlarged at ci scale and Llama-3.2-1B's shape on a GPU, graded also on a hidden shape
    (`catches`: what a solution fitted to the visible model gets wrong there). `task` is the
    method-specific part; the contract (what the grader does with the returned model, how the share
    and the peak are measured) is the same for all and stated here, naming no peft API."""
    knobs = {"method": method, "same_start": same_start, "max_trainable_share": max_trainable_share, "cover": cover}
    contract = ("`prepare_model(model)` 拿到评分器建好的 Llama 模型（随机权重，已经在设备上，所有参数 "
                "`requires_grad=True`），返回要训练的模型。评分器随后**只为 `requires_grad=True` 的参数**创建 AdamW，"
                "在固定的数据上训练几步，测稳态峰值。起始代码原样返回模型，也就是全量微调。\n\n"
                "怎么量：**可训练参数占比** = 返回的模型里 `requires_grad=True` 的参数个数 ÷ 返回的模型的全部参数个数"
                "（新加的参数也算在内）；**峰值显存**是预热一步之后训练时的最大已分配显存，与同一次评分里起始代码的峰值相比。"
                "隐藏配置里模型的层数、宽度和头数都会变，所以层数、维度、模块的位置都要从拿到的模型本身读出来，不能照着这里的形状写死。\n\n")
    # The hidden shape: one layer more (a list of the visible layers' indices misses it), narrower (a
    # hard-coded hidden size breaks), 7 query heads on 1 KV head; fewer parameters than the visible
    # model and a shorter sequence, so it costs less to grade than the visible case.
    hidden_config = {"num_hidden_layers": 5, "hidden_size": 224, "intermediate_size": 600,
                     "num_attention_heads": 7, "num_key_value_heads": 1, "head_dim": 32}
    hidden = (Variation(catches=catches, seq=48, config=hidden_config),)
    return ExerciseSpec(
        id=id, chapter=chapter, title=title, task=contract + task, function="prepare_model",
        signature="def prepare_model(model):", starter=FULL_FINETUNE,
        ci=Scale(model="llama-tiny", batch=2, seq=64, steps=3, warmup=1, hidden=hidden,
                 settings=finetune.Settings(**knobs, cublas_workspace=False, config=FINETUNE_CI_CONFIG)),
        # seq 320, not 512: at 4 x 512 the activations put every reference above its target (sim,
        # FakeTensorMode: LoRA all-linear 0.58, DoRA q/v/down 0.61); at 4 x 320 they are 0.44 and 0.46,
        # prompt/prefix tuning 0.40, and DoRA on all-linear still misses 0.53 (0.59)
        gpu=Scale(model="llama-1b", batch=4, seq=320, steps=4, warmup=1, settings=finetune.Settings(**knobs)),
        target_ratio=target_ratio, points=10, kind="finetune", hints=hints, giveaways=giveaways)
