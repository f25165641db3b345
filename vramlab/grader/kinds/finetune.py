"""Kind "finetune": `prepare_model(model)` returns the model to fine-tune (ch24-27); the grader then
trains it itself (AdamW over the parameters that require grad). It must be the required peft method
("technique" otherwise), adapting what `cover` asks for in every decoder layer, with a small trainable
share, learn (the loss goes down), start from the same function where the method promises it
(LoRA/DoRA begin as the identity), and peak at most target_ratio x full fine-tuning (the starter
returns the model as it is). The method and the coverage are read in the child and judged in the
parent; the task, criteria and feedback name the required method by its family, never the peft
class or switch that builds it (feedback may name the learner's own class).
"""
from __future__ import annotations

import math

from ...units import fmt_bytes
from .common import (Traits, INT, NUM, STR, CommonSettings, WrongAnswer, fail, list_of, malformed, nbytes, observed_unless_host,
                     optional, passed, ranks_lines, scale_settings, settings_class, with_host)

PEFT_METHODS = {     # method -> (peft config class name, use_dora, what the learner reads: no API name)
    "lora": ("LoraConfig", False, "LoRA（低秩旁路，基座冻结）"),
    "dora": ("LoraConfig", True, "DoRA（权重拆成幅度和方向，方向用低秩旁路更新）"),
    "prompt_tuning": ("PromptTuningConfig", None, "Prompt Tuning（只在输入端拼可训练的虚拟 token）"),
    "prefix_tuning": ("PrefixTuningConfig", None, "P-Tuning v2 / Prefix Tuning（每一层注意力的键和值前面都拼可训练的前缀）"),
}
METHOD_ZH = {m: label for m, (_, _, label) in PEFT_METHODS.items()}
# what the learner's config is, in words (feedback on a wrong method)
_FAMILY_ZH = {"LoraConfig": "LoRA", "PromptTuningConfig": "Prompt Tuning", "PrefixTuningConfig": "Prefix Tuning",
              "PromptEncoderConfig": "P-Tuning（v1，提示编码器）", "AdaLoraConfig": "AdaLoRA", "IA3Config": "IA³",
              "LoHaConfig": "LoHa", "LoKrConfig": "LoKr", "VeraConfig": "VeRA", "BoneConfig": "Bone"}
# cover -> what must be adapted in every decoder layer, as the learner reads it
COVER_ZH = {"": "",
            "every_linear": "每一层注意力和 MLP 里的每一个线性层都要加上适配器",
            "attn_and_mlp": "每一层的注意力和 MLP 里都要至少有一个线性层加上适配器",
            "every_layer": "每一层的注意力都要有可训练的前缀"}


@settings_class
class Settings(CommonSettings):
    method: str                    # a key of PEFT_METHODS
    same_start: bool               # the first loss equals full fine-tuning's (the adapter starts as the identity)
    max_trainable_share: float     # trainable parameters / all parameters
    cover: str = ""                # a key of COVER_ZH: what every decoder layer must have ("": not checked)

    def __post_init__(self):
        super().__post_init__()
        if self.method not in PEFT_METHODS:
            raise ValueError(f"finetune.Settings.method: unknown {self.method!r}; known: {sorted(PEFT_METHODS)}")
        if self.cover not in COVER_ZH:
            raise ValueError(f"finetune.Settings.cover: unknown {self.cover!r}; known: {sorted(COVER_ZH)}")


TRAITS = Traits(call_zh="第 {k} 步", first_call_zh="prepare_model", per_step_lines=True)
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def peft_method(prepared, method: str) -> str | None:
    """None when `prepared` is a peft model of the required method, else why not (Chinese)."""
    cls_name, dora, label = PEFT_METHODS[method]
    configs = getattr(prepared, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return (f"返回的不是 peft 包装过的模型（只改 requires_grad 不算）：本题要求用 peft 的 {label}，"
                "在评分器给你的模型上加适配器")
    cfg = configs.get(getattr(prepared, "active_adapter", "default")) or next(iter(configs.values()))
    name = type(cfg).__name__
    if name != cls_name or (dora is not None and bool(getattr(cfg, "use_dora", False)) != dora):
        dora_used = bool(getattr(cfg, "use_dora", False))
        used = "DoRA" if dora_used else _FAMILY_ZH.get(name, name)      # the learner's own class may be named
        return f"你用的是 {used}（{name}{'，use_dora=True' if dora_used else ''}），本题要求 {label}"
    return None


def uncovered(model, before: list[tuple[int, str, str]], base: set[int], cover: str, prepared=None) -> list[str]:
    """What `cover` asks for that the prepared model lacks, e.g. "有的层的 mlp.up_proj" (empty: all
    there; no layer index, so the feedback of a hidden case names no hidden number). `before`:
    (layer index, module path, "attn"/"mlp") of each linear layer of each decoder layer, read before
    prepare_model. A linear layer is adapted when, after prepare_model, the module at its path holds
    a trainable parameter that is not one of the model's own (`base`: their ids): peft replaces it
    by a wrapper holding the adapter; unfreezing the weight itself does not count."""
    if not cover:
        return []
    layers = model.model.layers
    if cover == "every_layer":             # prefix tuning: a prefix for every layer's attention
        cfg = next(iter((getattr(prepared, "peft_config", None) or {}).values()), None)
        n = getattr(cfg, "num_layers", None)
        return [] if n is None or n == len(layers) else ["前缀的层数与模型的层数不一致"]
    adapted = {}
    for i, path, part in before:
        try:
            module = layers[i].get_submodule(path)
        except AttributeError:
            adapted[(i, path, part)] = False
            continue
        adapted[(i, path, part)] = any(p.requires_grad and id(p) not in base for p in module.parameters())
    if cover == "every_linear":
        groups = {path: [ok for (_, q, _), ok in adapted.items() if q == path] for _, path, _ in before}
    else:                                  # attn_and_mlp: one of each, in every layer
        groups = {"注意力" if part == "attn" else "MLP": [] for _, _, part in before}
        for i in range(len(layers)):
            for part, name in (("attn", "注意力"), ("mlp", "MLP")):
                groups[name].append(any(ok for (j, _, pt), ok in adapted.items() if j == i and pt == part))
    none = [name for name, oks in groups.items() if not any(oks)]
    some = [name for name, oks in groups.items() if any(oks) and not all(oks)]
    return [f"{where}的{' ' if names[0].isascii() else ''}{'、'.join(names)}"
            for where, names in (("所有层", none), ("有的层", some)) if names]


def linear_layers(torch, model) -> list[tuple[int, str, str]]:
    """(layer index, module path inside the layer, "attn" or "mlp") of every linear layer of every decoder layer."""
    return [(i, path, "attn" if "attn" in path else "mlp") for i, layer in enumerate(model.model.layers)
            for path, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]


def setup(h) -> dict:
    """The model `prepare_model` gets and the one batch every step trains on (also
    `vramlab.exercise_setup`); the grader builds its AdamW after `prepare_model` returns."""
    model, _ = h.training_setup()
    batch = h.tokens((h.job.batch, h.job.seq))     # one batch, every step: the loss must go down
    return {"model": model, "batch": batch}


def scenario(h):
    import peft  # noqa: F401  (imported by trusted code, before the guards)
    torch, job = h.torch, h.job
    settings = h.settings
    built = setup(h)
    model, batch = built["model"], built["batch"]
    params = list(model.parameters())
    h.payload["static_bytes"] = nbytes(*params)          # the frozen base alone must stay on the device
    warmup = job.warmup

    before = linear_layers(torch, model)

    def run(fn):
        prepared = h.call(lambda: fn(model))
        if not isinstance(prepared, torch.nn.Module):
            raise WrongAnswer(f"prepare_model 应当返回 torch.nn.Module，实际返回了 {type(prepared).__name__}")
        mine = {id(p) for p in prepared.parameters()}
        if not all(id(p) in mine for p in params):
            raise WrongAnswer("返回的模型不包含评分器给你的那个模型的全部参数：要在它上面加适配器，不能换成别的模型")
        why_not, missing = None, []
        if not job.reference:                     # the starter is full fine-tuning
            why_not = peft_method(prepared, settings.method)
            missing = [] if why_not else uncovered(model, before, {id(p) for p in params}, settings.cover, prepared)
        trainable = [p for p in prepared.parameters() if p.requires_grad]
        total = sum(p.numel() for p in prepared.parameters())
        n_trainable = sum(p.numel() for p in trainable)
        if not trainable:
            raise WrongAnswer("没有任何参数 requires_grad=True：什么也训练不了")
        optimizer = torch.optim.AdamW(trainable, lr=float(job.lr), foreach=True)
        losses, times = [], []

        def step(batch):
            loss = prepared(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        h.reset_peak()
        for i in range(job.steps):
            if i == warmup:
                h.reset_peak()
            losses.append(h.call(lambda: step(batch)))
            times.append(h.seconds)
        return {"peak_bytes": h.peak(), "losses": losses, "trainable": n_trainable, "total": total,
                "step_seconds": min(times[warmup:] or times), "method_error": why_not, "uncovered": missing[:50]}
    return run


PAYLOAD = dict(peak_bytes=INT, losses=list_of(NUM), trainable=INT, total=INT, step_seconds=optional(NUM),
               method_error=optional(STR), uncovered=optional(list_of(STR, 50)))


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    why = malformed(sp, **PAYLOAD)
    if why:
        return fail(result, "tamper", why)
    settings = scale_settings(spec, result)
    peak, base_peak = sp["peak_bytes"], int(bp["peak_bytes"])
    result.update(peak_bytes=peak, ratio=round(peak / base_peak, 4) if base_peak else None,
                  step_seconds=sp.get("step_seconds"), trainable=sp["trainable"], total=sp["total"])
    losses, base_losses = sp["losses"], bp.get("losses") or []
    share = sp["trainable"] / max(sp["total"], 1)
    result["correct"] = False
    if sp.get("method_error"):
        return fail(result, "technique", sp["method_error"])
    if sp.get("uncovered"):
        return fail(result, "technique", f"本题要求{COVER_ZH[settings.cover]}，没有做到：{'；'.join(sp['uncovered'][:4])}。"
                                         "要适配的模块和层应当从拿到的模型本身读出来，不能照着某个形状写死")
    if not losses or not all(math.isfinite(x) for x in losses):
        return fail(result, "incorrect", f"训练中出现了非有限的损失：{losses[:20]}")
    if share > settings.max_trainable_share:
        return fail(result, "incorrect", f"可训练参数占 {share:.2%}（{sp['trainable']:,} / {sp['total']:,}），"
                                         f"本题要求参数高效微调：不超过 {settings.max_trainable_share:.0%}")
    if settings.same_start and abs(losses[0] - base_losses[0]) > spec.atol + spec.rtol * abs(base_losses[0]):
        return fail(result, "incorrect", f"第 1 步的损失 {losses[0]:.5f} 与全量微调的 {base_losses[0]:.5f} 不同：适配器一开始"
                                         "应当是恒等变换（LoRA 的 B 矩阵初始化为 0），别改动基座模型")
    if not losses[-1] < losses[0]:
        return fail(result, "incorrect", f"训练 {len(losses)} 步后损失没有下降（{['%.4f' % x for x in losses[:20]]}）："
                                         "检查可训练的参数是不是真的接在计算图上")
    result["correct"] = True
    if peak < int(bp.get("static_bytes", 0)):
        return fail(result, "tamper", f"测得的峰值 {fmt_bytes(peak)} 低于基座模型参数本身的大小 "
                                      f"{fmt_bytes(int(bp['static_bytes']))}：显存计量被绕过了")
    if base_peak and peak > spec.target_ratio * base_peak:
        return fail(result, "too_much_memory", f"峰值 {fmt_bytes(peak)} 是全量微调（{fmt_bytes(base_peak)}）的 "
                                               f"{peak / base_peak:.2f} 倍，目标是不超过 {spec.target_ratio:.2f} 倍")
    return passed(spec, result, f"峰值是全量微调的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}），"
                                f"可训练参数 {sp['trainable']:,} 个（{share:.2%}），损失 {losses[0]:.4f} → {losses[-1]:.4f}")


def criteria_zh(spec) -> list[str]:
    s, pct = spec.ci.settings, f"{spec.target_ratio * 100:g}%"
    cover = f"，{COVER_ZH[s.cover]}" if s.cover else ""
    return [*ranks_lines(spec),
            f"- **方法对**：返回用 peft 的 {METHOD_ZH[s.method]}包装的模型{cover}；",
            f"- **参数高效**：可训练参数（返回的模型里 `requires_grad=True` 的参数个数）不超过全部参数个数的 "
            f"{s.max_trainable_share:.0%}；",
            "- **在学习**：评分器训练几步后损失要下降" +
            ("，且第 1 步的损失与全量微调相同（适配器初始是恒等变换）；" if s.same_start else "；"),
            f"- **省显存**：训练的峰值显存 ≤ 全量微调（起始代码）峰值的 **{pct}**（同一次运行、同一后端上测得）。"]
