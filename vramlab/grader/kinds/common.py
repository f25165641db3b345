"""What several exercise kinds share: settings, child-side helpers, result helpers, payload checks,
the Chinese labels judges print.

Imported by the trusted parent (judges, specs) and by the grader's child before any learner code
runs, so: no torch at import time, no import of vramlab.grader.core or vramlab.exercises.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import field

from ... import vocab
from ...units import fmt_bytes


# ---- settings: the typed per-exercise knobs of a kind ------------------------------------------
def settings_class(cls):
    """`@dataclass(frozen=True, kw_only=True)` whose constructor checks every value against its
    annotation and names the known fields when given an unknown one: a typo in a spec fails when
    the spec is built, not in the middle of a grading."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    init, known = cls.__init__, {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(init)
    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: unknown setting(s) {unknown}; "
                            f"known: {sorted(known)}")
        init(self, **kwargs)
    cls.__init__ = __init__
    return cls


def _tuples(value):
    """JSON gives lists where a spec wrote tuples: turn them back (dicts are left alone)."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    return value


def _conforms(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_conforms, value, args))
    return isinstance(value, origin or hint)


@settings_class
class CommonSettings:
    """Knobs every kind understands: the job and the harness read them whatever the kind."""
    config: dict = field(default_factory=dict)   # overrides of the model preset's config
    lr: float = 1e-3                             # the grader's AdamW
    world_size: int = 1                          # > 1: that many ranks over gloo; the worst rank counts
    cublas_workspace: bool = True                # the sim's cuBLAS workspaces (off where 64 MiB would hide the lesson)
    allow_host: bool = False                     # host memory is the lesson: device.host()/to_host()/save_on_cpu()
    floor_copies: float | None = None            # physical floor = parameter bytes x this (harness default: 4, 2 with allow_host)
    bitsandbytes: bool = False                   # import bitsandbytes before the guards (8-bit optimizers)

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, dict):
                value = _tuples(value)
                object.__setattr__(self, f.name, value)
            if not _conforms(value, hints[f.name]):
                raise TypeError(f"{type(self).__module__}.Settings.{f.name} should be {hints[f.name]}, got {value!r}")


def explicit(settings) -> dict:
    """The settings a spec chose: required fields and those that differ from their default (what
    the learner's notebook lists as the scale's other settings)."""
    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            out[f.name] = value
            continue
        if value != default:
            out[f.name] = value
    return out


def with_host(base: frozenset, settings) -> frozenset:
    """A kind's guard permissions, plus host memory where the exercise is about it."""
    return base | {"host"} if settings.allow_host else base


def observed_unless_host(settings) -> bool:
    """The parent's RSS cross-check applies unless host memory is the lesson (RSS cannot tell
    host memory from simulated device memory)."""
    return not settings.allow_host


# ---- child side -----------------------------------------------------------------------------------
# ---- what the code outside kinds/ needs to know about a kind ------------------------------------
HOW_GRADED_ZH = (
    "1. 从上到下运行所有单元格。起始代码本身能运行、结果正确，只是显存超标：直接修改下面的函数。",
    "2. 最后一个单元格调用 `vramlab.check(\"{id}\")`：它在一个**独立的子进程**里，用同样的模型、"
    "同样的数据，先跑起始代码、再跑你的函数，测两者的峰值显存并比较结果。",
    "3. 目标是与起始代码的**比例**，两者在同一次运行、同一后端上测得，所以在任何 GPU 上、"
    "在 CPU 上的模拟设备上都成立。",
)


def how_graded_against_measurement_zh(starter_problem_zh: str) -> tuple[str, ...]:
    """The notebook's "怎么评分" for a kind whose answer is a number compared with the grader's own
    measurement (estimate, monitor)."""
    return (
        f"1. 从上到下运行所有单元格。起始代码{starter_problem_zh}：直接修改下面的函数。",
        "2. 最后一个单元格调用 `vramlab.check(\"{id}\")`：它在一个**独立的子进程**里运行你的函数，"
        "把结果与评分器在模拟设备上的实测值逐个比较。",
        "3. 实测值与你的结果在同一次评分里、同一后端上得到，所以在任何 GPU 上、在 CPU 上的模拟设备上都成立。",
    )


@dataclasses.dataclass(frozen=True)
class Traits:
    """A kind's words and habits, declared by the kind (`TRAITS` in its module) so that the
    notebook, the page, the report and the feedback never test a kind's name
    (tests/test_kinds.py fails on a kind name compared anywhere outside kinds/).

    Learner-facing text is Chinese; `{k}`, `{id}` and the scale's fields are filled in by the caller."""
    judged_zh: str = "峰值显存"                             # the exercise table's "what is judged"
    starter_problem_zh: str = "结果正确，但峰值显存超过目标"    # the answer cell's first comment
    how_graded_zh: tuple[str, ...] = HOW_GRADED_ZH           # the notebook's "怎么评分" (with {id})
    scale_zh: str = "模型 `{model}`，batch {batch}，序列长度 {seq}，{steps} 步（前 {warmup} 步预热，不计峰值）"
    call_zh: str = "第 {k} 次调用"                           # the learner's k-th call (1-based)
    first_call_zh: str | None = None                        # the first call's own name (finetune: prepare_model)
    training_steps: bool = False     # each call is a training step after a warm-up: feedback counts steps
    per_step_lines: bool = False     # feedback prints allocated after each call (leak and OOM evidence)
    epoch: bool = False              # one call is an epoch with optimizer steps inside
    oom_where_zh: str | None = None  # where an overflow is reported when it is not in a call or an epoch step
    memory_view: bool = True         # feedback shows where memory went (False: the answer is a number)
    timeline_only: bool = False      # only the timeline is the learner's (the peak includes the grader's re-check)
    report: str = "ratio"            # the report's headline: "ratio", "error" (worst relative error), "answer"
    fresh_case_seed: bool = False    # hidden case values drawn anew for every grading (a copied number is useless)
    techniques: tuple[str, ...] = ()     # technique checks a spec of this kind may ask for

    def call_name(self, k: int) -> str:
        """The learner's k-th call (1-based), as this kind's exercise calls it."""
        if self.first_call_zh is not None:
            return self.first_call_zh if k == 1 else self.call_zh.format(k=k - 1)
        return self.call_zh.format(k=k)

    def oom_where(self, oom: dict) -> str:
        """Where an overflow happened: an optimizer step of the epoch, a call, or the function."""
        if self.epoch:
            return f"epoch 的第 {oom['optimizer_steps'] + 1} 步"
        if self.oom_where_zh is not None:
            return self.oom_where_zh
        if self.per_step_lines:
            return self.call_name(oom["call"])
        return "你的函数里"


class WrongAnswer(ValueError):
    """What the learner's function returned is not an answer to the question (wrong type, shape,
    place, or side effect): graded "incorrect", with this message."""


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def host_randn(h, *shape, scale: float = 1.0):
    """Seeded data created in host memory (a fresh generator per job keeps both runs identical)."""
    with h.dev.host():
        return h.torch.randn(*shape, generator=h.gen) * scale


def measured(h, thunk):
    """Call learner code from a fresh peak; returns (value, peak, peak reserved)."""
    h.reset_peak()
    value = h.call(thunk)
    return value, h.peak(), h.reserved_peak()


# ---- results ---------------------------------------------------------------------------------------
# What the learner reads. `category` is a stable English key (tests, JSON); `reason` is Chinese.
CATEGORY_ZH = {
    "ok": "通过",
    "too_much_memory": "峰值显存没有降到目标以下",
    "incorrect": "结果与起始代码不一致",
    "technique": "没有使用本题要求的方法",
    "slow": "单步耗时超出允许范围",
    "too_many_trials": "试探次数太多",
    "timeout": "运行超时",
    "crashed": "进程异常退出",
    "exit": "代码调用了退出",
    "exception": "代码运行出错",
    "oom": "内存/显存不足",
    "tamper": "干扰了显存计量",
    "forbidden": "执行了评分沙箱禁止的操作",
    "invalid_submission": "提交的文件无法评分",
}


class BaselineBroken(RuntimeError):
    """The trusted starter's own result is not what it must be: the grader is broken, not the learner."""


def fail(result: dict, category: str, reason: str) -> dict:
    result.update(passed=False, score=0, category=category,
                  reason=f"{CATEGORY_ZH.get(category, category)}：{reason}" if reason else CATEGORY_ZH[category])
    return result


def passed(spec, result: dict, reason: str) -> dict:
    result.update(passed=True, score=spec.points, category="ok", reason=f"通过：{reason}")
    return result


def rel(a: list[float], b: list[float]) -> float:
    """||a - b|| / ||b|| (0 when both are 0, inf when only b is)."""
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(y * y for y in b))
    return num / den if den else (0.0 if num == 0 else math.inf)


def worst_case(result: dict, answers: list, truths: list, tol: float) -> int:
    """estimate / monitor: the case with the largest relative error. The result's `peak_bytes` is
    the learner's answer there, `baseline_peak_bytes` the trusted truth, `ratio` the error."""
    errs = [abs(a - t) / t if t and math.isfinite(a) else math.inf for a, t in zip(answers, truths)]
    if len(answers) != len(truths) or not errs:
        errs = [math.inf]
    i = max(range(len(errs)), key=errs.__getitem__)
    ok = math.isfinite(errs[i])
    result.update(peak_bytes=int(answers[i]) if ok else None, baseline_peak_bytes=int(truths[i]) if truths else None,
                  ratio=round(errs[i], 4) if ok else None, correct=errs[i] <= tol)
    return i


def scale_settings(spec, result: dict):
    """The settings of the scale this result was graded at."""
    return getattr(spec, result["scale"]).settings


# ---- the learner's payload is a claim: check its shape before reading it ---------------------------
MAX_ITEMS = 100_000        # longer lists are not something the harness writes


def _leaf(ok, what: str):
    def check(value, path: str):
        return None if ok(value) else f"{path} 应当是{what}"
    return check


INT = _leaf(lambda v: type(v) is int and 0 <= v < 2 ** 63, "非负整数")
NUM = _leaf(lambda v: type(v) is float or (type(v) is int and abs(v) < 2 ** 63), "数")    # NaN/inf allowed: judged, not malformed
STR = _leaf(lambda v: type(v) is str and len(v) <= 10_000, "字符串")
BOOL = _leaf(lambda v: type(v) is bool, " true 或 false")


def optional(check):
    """The field may be missing or null."""
    def opt(value, path: str):
        return None if value is None else check(value, path)
    opt.optional = True
    return opt


def list_of(item, max_items: int = MAX_ITEMS):
    def check(value, path: str):
        if type(value) is not list:
            return f"{path} 应当是列表"
        if len(value) > max_items:
            return f"{path} 太长（{len(value)} 项，最多 {max_items} 项）"
        for i, x in enumerate(value):
            why = item(x, f"{path}[{i}]")
            if why:
                return why
        return None
    return check


def pair(first, second):
    """A two-element list, e.g. [batch, fitted]."""
    def check(value, path: str):
        if type(value) is not list or len(value) != 2:
            return f"{path} 应当是两个元素的列表"
        return first(value[0], f"{path}[0]") or second(value[1], f"{path}[1]")
    return check


def dict_of(item, max_items: int = 1000):
    def check(value, path: str):
        if type(value) is not dict or len(value) > max_items:
            return f"{path} 应当是字典"
        for k, v in value.items():
            why = item(v, f"{path}.{k}")
            if why:
                return why
        return None
    return check


def record(**fields):
    """A dict with these fields (others are ignored); fields wrapped in `optional` may be missing."""
    def check(value, path: str):
        if type(value) is not dict:
            return f"{path or '结果'} 应当是字典"
        for name, field_check in fields.items():
            where = f"{path}.{name}" if path else name
            if name not in value:
                if getattr(field_check, "optional", False):
                    continue
                return f"缺少字段 {where}"
            why = field_check(value[name], where)
            if why:
                return why
        return None
    return check


def malformed(payload, **fields) -> str | None:
    """None when `payload` has these fields of these shapes, else the Chinese reason to fail it
    with ("tamper": the harness never writes such a result, so the learner's code changed it)."""
    why = record(**fields)(payload, "")
    return f"结果文件的格式不对：{why}" if why else None


# ---- Chinese labels and lines shared by judges and pass criteria ---------------------------------
# (label, what saves it) for the categories a technique can save: vocab.py's words
MEMORY_CATEGORY_ZH = {k: (vocab.label(k), how) for k, how in vocab.SAVED_BY.items()}
METRIC_ZH = {"peak_allocated": "峰值显存", "reserved_gap": "已保留与已分配峰值之差（reserved − allocated）"}


def savings(base: dict, mine: dict) -> dict:
    """Bytes saved per memory category at the peak (starter minus submission), largest first."""
    saved = {k: int(base.get(k, 0)) - int(mine.get(k, 0)) for k in MEMORY_CATEGORY_ZH if k in base or k in mine}
    return dict(sorted(saved.items(), key=lambda kv: -kv[1]))


def savings_line(result: dict) -> str:
    saved = result.get("savings")
    if not saved:
        return ""
    parts = [f"{MEMORY_CATEGORY_ZH[k][0]} {'省下' if v >= 0 else '多用'} {fmt_bytes(abs(v))}（{MEMORY_CATEGORY_ZH[k][1]}）"
             for k, v in saved.items() if abs(v) >= 2 ** 20]
    return ("。峰值时各类显存与起始代码相比（两边的峰值可能出现在一步中的不同时刻，所以某一类可能“多用”）："
            + "；".join(parts)) if parts else ""


def ranks_lines(spec) -> list[str]:
    ranks = spec.ci.settings.world_size
    if ranks > 1:
        return [f"- **多进程**：评分器启动 {ranks} 个 rank（gloo），每个 rank 分别检查，峰值取各 rank 中最大的；"]
    return []


def memory_lines(spec) -> list[str]:
    """The memory criterion (and the time limit) of kinds judged against the starter's peak."""
    pct = f"{spec.target_ratio * 100:g}%"
    if spec.metric == "reserved_gap":
        lines = [f"- **少碎片**：已保留峰值 − 已分配峰值（`max_memory_reserved − max_memory_allocated`）≤ 起始代码的 "
                 f"**{pct}**，且已保留峰值不高于起始代码（同一次运行、同一后端上测得）；",
                 "- 不许调用 `empty_cache()`。"]
    else:
        lines = [f"- **省显存**：峰值显存 ≤ 起始代码峰值的 **{pct}**（同一次运行、同一后端上测得）。"]
    if spec.max_time_ratio is not None:
        lines.append(f"- **不太慢**：每步时间 ≤ 起始代码的 {spec.max_time_ratio:g} 倍。")
    return lines


def host_meter(h):
    """A dispatch mode that counts host-memory storages created while it is active: on the sim those
    made under `device.host()` (which the simulated device does not charge), on a GPU CPU storages.
    `.peak`: the most bytes alive at once (ch03: host memory held); `.created`: all bytes ever
    created (ch28: what was copied to the host). Like the device meter, feedback inside the
    learner's interpreter, not a boundary."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    torch = h.torch
    if h.sim:
        tracker = h.dev.tracker

        def is_host(t) -> bool:     # created under device.host(): the simulated device did not charge it
            return bool(tracker.host) and not tracker.paused and t.untyped_storage()._cdata not in tracker.live
    else:
        def is_host(t) -> bool:
            return t.device.type == "cpu"

    class HostMeter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, tuple[int, object]] = {}
            self.current = self.peak = self.created = 0

        def _release(self, key):
            rec = self.live.pop(key, None)
            if rec is not None:
                self.current -= rec[0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = None
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor) or t.device.type == "meta" or not is_host(t):
                    continue
                st = t.untyped_storage()
                key = st._cdata
                if key in self.live:
                    continue
                if inputs is None:        # a view or in-place result shares an input's storage
                    inputs = {a.untyped_storage()._cdata for a in tree_leaves((args, kwargs))
                              if isinstance(a, torch.Tensor) and a.device.type != "meta"}
                if key in inputs or not st.nbytes():
                    continue
                self.live[key] = (st.nbytes(), weakref.ref(st, lambda _r, key=key: self._release(key)))
                self.current += st.nbytes()
                self.created += st.nbytes()
                self.peak = max(self.peak, self.current)
            return out
    return HostMeter()
