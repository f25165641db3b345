"""Kind "call": one call of a function on inputs the harness prepared (CALL_CASES, `settings.case`).
The same outputs as the starter (every output tensor, every rank, within rtol) and a memory metric
(the peak, or reserved minus allocated) at most target_ratio x the starter's. Case "moe" also counts
the matmul FLOPs of the call (torch.utils.flop_counter): a top-k MoE must not run every expert on
every token, whatever its peak (an all-experts loop, or one over token chunks, is small too).
"""
from __future__ import annotations

import dataclasses
import math

from ...units import fmt_bytes
from .common import (Traits, INT, METRIC_ZH, NUM, BaselineBroken, CommonSettings, WrongAnswer, fail, host_randn, list_of,
                     malformed, measured, memory_lines, nbytes, observed_unless_host, optional, passed, ranks_lines,
                     rel, settings_class, with_host)


@settings_class
class Settings(CommonSettings):
    case: str                          # a key of CALL_CASES; the knobs it reads are CASE_KNOBS[case]
    d_model: int | None = None
    n_batches: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str = "float32"             # a torch dtype name (CUDA's GQA kernels need bfloat16)
    lengths: tuple[int, ...] = ()
    vocab: int | None = None
    hidden: int | None = None
    layers: int = 1
    eps: float = 1e-6
    experts: int | None = None
    top_k: int | None = None
    d_in: int | None = None
    d_out: int | None = None
    softcap: float | None = None       # attention: scores -> softcap * tanh(scores / softcap) (Gemma 2)
    observer_slack_mib: float = 0      # added to the out-of-process check's allowance (core._hidden_memory):
                                       # ch14's honest query blocks leave CPU temporaries in the C allocator

    def __post_init__(self):
        super().__post_init__()
        if self.case not in CASE_KNOBS:
            raise ValueError(f"call.Settings.case: unknown case {self.case!r}; known: {sorted(CASE_KNOBS)}")
        unset = [k for k in CASE_KNOBS[self.case] if getattr(self, k) in (None, ())]
        if unset:
            raise ValueError(f"call.Settings: case {self.case!r} needs {unset}")
        stray = [f.name for f in dataclasses.fields(Settings)
                 if f.name in ALL_KNOBS and f.name not in CASE_KNOBS[self.case] and getattr(self, f.name) != f.default]
        if stray:
            raise ValueError(f"call.Settings: case {self.case!r} does not read {stray}")


TRAITS = Traits(scale_zh="batch {batch}，序列长度 {seq}")
PERMISSIONS: frozenset[str] = frozenset()
OBSERVED = True


def permissions(settings: Settings) -> frozenset[str]:
    return with_host(PERMISSIONS, settings)


def observed(settings: Settings) -> bool:
    return OBSERVED and observed_unless_host(settings)


def on_device(h, value, shape, what: str):
    """A returned tensor must have the expected shape and live on the device."""
    if not isinstance(value, h.torch.Tensor):
        raise WrongAnswer(f"{what} 应当返回张量，实际返回了 {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise WrongAnswer(f"{what} 返回的形状是 {tuple(value.shape)}，应当是 {tuple(shape)}")
    if not h.tracked(value):
        raise WrongAnswer(f"{what} 返回的张量不在设备上（显存里）：用 device.to_device() 把结果搬到设备上")
    return value


def case_tp_mlp(h, s: Settings):
    """ch09: `tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device)` on every rank; the
    full weights live in host memory, x on the device; the full output on every rank."""
    d, b, seq = s.d_model, h.job.batch, h.job.seq
    weights = [host_randn(h, 4 * d, d, scale=0.02), host_randn(h, 4 * d, scale=0.02),
               host_randn(h, d, 4 * d, scale=0.02), host_randn(h, d, scale=0.02)]
    x = h.dev.to_device(host_randn(h, b, seq, d))

    def run(fn):
        y, peak, reserved = measured(h, lambda: fn(x, *weights, h.dev))
        on_device(h, y, (b, seq, d), "tp_mlp")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": nbytes(x, y)}
    return run


def case_eval_loop(h, s: Settings):
    """ch12: `evaluate(model, batches, device)`: the mean loss over batches already on the device;
    the model must come out unchanged."""
    model, _ = h.training_setup()
    batches = list(h.tokens((s.n_batches, h.job.batch, h.job.seq)))
    before = h.fingerprint(model.parameters())
    static = sum(nbytes(p) for p in model.parameters())

    def run(fn):
        value, peak, reserved = measured(h, lambda: float(fn(model, batches, h.dev)))
        if h.fingerprint(model.parameters()) != before:
            raise WrongAnswer("evaluate 改变了模型参数：评估只读不写")
        return {"outputs": [[value]], "peak_bytes": peak, "metric_bytes": peak, "floor_bytes": static}
    return run


def case_attention(h, s: Settings):
    """ch14: `attention(q, k, v, softcap)`, causal, scores soft-capped before the softmax (no fused
    SDPA kernel computes that); the harness backpropagates a fixed random gradient."""
    b, seq = h.job.batch, h.job.seq
    q, k, v = (h.dev.to_device(host_randn(h, b, s.heads, seq, s.head_dim)).requires_grad_() for _ in range(3))
    return backprop_case(h, lambda fn: fn(q, k, v, s.softcap), (b, s.heads, seq, s.head_dim), "attention", (q, k, v))


def case_embedding(h, s: Settings):
    """ch15: `embed(ids, table, device)`: the table lives in host memory, ids on the device."""
    b, seq = h.job.batch, h.job.seq
    table = host_randn(h, s.vocab, s.d_model)
    with h.dev.host():
        ids_host = h.torch.randint(0, s.vocab, (b, seq), generator=h.gen)
    ids = h.dev.to_device(ids_host)

    def run(fn):
        out, peak, reserved = measured(h, lambda: fn(ids, table, h.dev))
        on_device(h, out, (b, seq, s.d_model), "embed")
        return {"outputs": [h.fingerprint([out])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": nbytes(ids, out)}
    return run


def case_fragmentation(h, s: Settings):
    """ch11: `process(requests, weight, device)`: requests of growing length arrive in host memory;
    one result per request stays on the device. Metric: peak reserved minus peak allocated."""
    d = s.d_model
    requests = [host_randn(h, int(n), d) for n in s.lengths]
    weight = h.dev.to_device(host_randn(h, d, 4 * d, scale=0.05))

    def run(fn):
        outs, peak, reserved = measured(h, lambda: fn(requests, weight, h.dev))
        if not isinstance(outs, (list, tuple)) or len(outs) != len(requests):
            raise WrongAnswer(f"process 应当返回 {len(requests)} 个结果的列表（每个请求一个，顺序不变）")
        for out, x in zip(outs, requests):
            on_device(h, out, (x.shape[0], d), "process 的每个结果")
        return {"outputs": [h.fingerprint(list(outs))], "peak_bytes": peak, "reserved_peak_bytes": reserved,
                "metric_bytes": reserved - peak, "floor_bytes": nbytes(weight, *outs)}
    return run


def backprop_case(h, forward, out_shape, what: str, leaves, dtype=None):
    """`forward(fn)` runs the learner's function (once or more) and returns the output; backward
    with a fixed random gradient; the output and the gradient of every leaf are compared with the
    starter's."""
    grad_out = h.dev.to_device(host_randn(h, *out_shape))
    if dtype is not None:
        grad_out = grad_out.to(dtype)

    def run(fn):
        def forward_backward():
            out = on_device(h, forward(fn), out_shape, what)
            if not out.requires_grad:
                raise WrongAnswer(f"{what} 的输出不能求导：不要 detach，也不要在 no_grad 里计算")
            out.backward(grad_out)
            return out
        out, peak, reserved = measured(h, forward_backward)
        grads = [t.grad for t in leaves]
        if any(g is None for g in grads):
            raise WrongAnswer(f"{what} 的输入没有都得到梯度：输出要能对每个输入求导")
        return {"outputs": [h.fingerprint([t]) for t in (out.detach(), *grads)], "peak_bytes": peak,
                "metric_bytes": peak, "floor_bytes": nbytes(grad_out, *leaves, *grads)}
    return run


def case_gqa_attention(h, s: Settings):
    """ch16: `attention(q, k, v)` with fewer key/value heads than query heads (GQA), causal."""
    b, seq = h.job.batch, h.job.seq
    dtype = getattr(h.torch, s.dtype)
    q = h.dev.to_device(host_randn(h, b, s.heads, seq, s.head_dim)).to(dtype).requires_grad_()
    k, v = (h.dev.to_device(host_randn(h, b, s.kv_heads, seq, s.head_dim)).to(dtype).requires_grad_() for _ in range(2))
    return backprop_case(h, lambda fn: fn(q, k, v), (b, s.heads, seq, s.head_dim), "attention", (q, k, v), dtype=dtype)


def case_rms_norm(h, s: Settings):
    """ch18: `rms_norm(x, weight, eps)` in a residual stack of `layers` pre-norm layers
    (h = h + rms_norm(h, w_i)), as in a Transformer: what each call saves for backward adds up
    over the layers, its temporaries do not."""
    dtype = getattr(h.torch, s.dtype)
    tokens = h.job.batch * h.job.seq
    x = h.dev.to_device(host_randn(h, tokens, s.hidden)).to(dtype).requires_grad_()
    weights = [h.dev.to_device(1 + host_randn(h, s.hidden, scale=0.1)).to(dtype).requires_grad_()
               for _ in range(s.layers)]

    def forward(fn):
        out = x
        for w in weights:
            out = out + fn(out, w, s.eps)
        return out
    return backprop_case(h, forward, (tokens, s.hidden), "rms_norm", (x, *weights), dtype=dtype)


def case_int8_linear(h, s: Settings):
    """ch22: `int8_linear(x, weight_int8, scale)`: weight-only INT8 (per output channel), forward only."""
    torch = h.torch
    tokens = h.job.batch * h.job.seq
    w = host_randn(h, s.d_out, s.d_in, scale=0.02)
    with h.dev.host():
        scale = w.abs().amax(dim=1) / 127
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    x, weight_int8, scale = (h.dev.to_device(t) for t in (host_randn(h, tokens, s.d_in), q, scale))

    def run(fn):
        y, peak, _ = measured(h, lambda: fn(x, weight_int8, scale))
        on_device(h, y, (tokens, s.d_out), "int8_linear")
        if y.dtype != x.dtype:
            raise WrongAnswer(f"int8_linear 返回的类型是 {y.dtype}，应当与 x 相同（{x.dtype}）")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": nbytes(x, weight_int8, scale, y)}
    return run


def case_moe(h, s: Settings):
    """ch17: `moe_forward(x, router_weight, w_gate, w_up, w_down, top_k)`: a top-k mixture of SwiGLU
    experts (Mixtral) on [tokens, d], forward only (inference); also the call's matmul FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    tokens, d, e, f = h.job.batch * h.job.seq, s.d_model, s.experts, s.hidden
    x = h.dev.to_device(host_randn(h, tokens, d))
    router = h.dev.to_device(host_randn(h, e, d, scale=0.5))
    w_gate, w_up = (h.dev.to_device(host_randn(h, e, f, d, scale=0.05)) for _ in range(2))
    w_down = h.dev.to_device(host_randn(h, e, d, f, scale=0.05))

    def run(fn):
        def counted():
            with FlopCounterMode(display=False) as counter:
                out = fn(x, router, w_gate, w_up, w_down, s.top_k)
            return out, counter.get_total_flops()
        (y, flops), peak, reserved = measured(h, counted)
        on_device(h, y, (tokens, d), "moe_forward")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak, "flops": int(flops),
                "floor_bytes": nbytes(x, router, w_gate, w_up, w_down, y)}
    return run


CALL_CASES = {"tp_mlp": case_tp_mlp, "eval_loop": case_eval_loop, "attention": case_attention,
              "embedding": case_embedding, "fragmentation": case_fragmentation, "gqa_attention": case_gqa_attention,
              "rms_norm": case_rms_norm, "moe": case_moe, "int8_linear": case_int8_linear}
CASE_KNOBS = {"tp_mlp": ("d_model",), "eval_loop": ("n_batches",), "attention": ("heads", "head_dim", "softcap"),
              "embedding": ("vocab", "d_model"), "fragmentation": ("d_model", "lengths"),
              "gqa_attention": ("heads", "kv_heads", "head_dim", "dtype"),
              "rms_norm": ("hidden", "layers", "eps", "dtype"), "moe": ("d_model", "hidden", "experts", "top_k"),
              "int8_linear": ("d_in", "d_out")}
ALL_KNOBS = {k for knobs in CASE_KNOBS.values() for k in knobs}


def scenario(h):
    s = h.settings
    return CALL_CASES[s.case](h, s)


PAYLOAD = dict(peak_bytes=INT, metric_bytes=INT, outputs=list_of(list_of(NUM)),
               reserved_peak_bytes=optional(INT), rank_peak_bytes=optional(list_of(INT)), flops=optional(INT))
# case moe: the experts' work may be at most this x top_k/experts of the starter's (all experts on all
# tokens): room for the router and for padding each expert's batch to a capacity; E/k x does not fit
MOE_FLOP_SLACK = 1.5
# what to check first when the result differs, per case (the starter's own maths, not the way to save)
INCORRECT_NOTE_ZH = {
    "attention": "先核对分数的缩放、软上限（softcap · tanh(分数 / softcap)）和因果掩码是否都和起始代码一样",
    "gqa_attention": "先核对每个查询头用的是不是它所在组的键值头，以及因果掩码",
    "moe": "先核对每个 token 选的专家、门控权重（只在选中的 top-k 个得分上做 softmax）和专家的 SwiGLU 计算",
}


def judge(spec, result: dict, bp: dict, sp: dict) -> dict:
    why = malformed(sp, **PAYLOAD)
    if why:
        return fail(result, "tamper", why)
    metric, base_metric = sp["metric_bytes"], int(bp["metric_bytes"])
    result.update(peak_bytes=sp["peak_bytes"], ratio=round(metric / base_metric, 4) if base_metric else None,
                  metric=spec.metric, metric_bytes=metric, baseline_metric_bytes=base_metric,
                  rank_peak_bytes=sp.get("rank_peak_bytes"))
    outs, base_outs = sp["outputs"], bp.get("outputs") or []
    same_shape = len(outs) == len(base_outs) and all(len(a) == len(b) for a, b in zip(outs, base_outs))
    err = max((rel(a, b) for a, b in zip(outs, base_outs)), default=math.inf) if same_shape else math.inf
    result["update_rel_err"] = err
    result["correct"] = bool(math.isfinite(err) and err <= spec.rtol)
    what = METRIC_ZH.get(spec.metric, "峰值")
    case = getattr(getattr(spec, result.get("scale") or "ci").settings, "case", None)
    if not result["correct"]:
        note = INCORRECT_NOTE_ZH.get(case)
        return fail(result, "incorrect", f"结果与起始代码不同（相对误差 {err:.3g}，允许 {spec.rtol:g}）"
                                         + (f"：{note}" if note else ""))
    if sp["peak_bytes"] < int(bp.get("floor_bytes", 0)):
        return fail(result, "tamper", f"测得的峰值 {fmt_bytes(sp['peak_bytes'])} 低于输入和输出本身的大小 "
                                      f"{fmt_bytes(int(bp['floor_bytes']))}：显存计量被绕过了")
    if spec.metric == "reserved_gap" and (sp.get("reserved_peak_bytes") or 0) > int(bp.get("reserved_peak_bytes", 0)):
        return fail(result, "too_much_memory", f"已保留峰值 {fmt_bytes(sp['reserved_peak_bytes'])} 比起始代码的 "
                                               f"{fmt_bytes(int(bp['reserved_peak_bytes']))} 还高")
    if base_metric and metric > spec.target_ratio * base_metric:
        return fail(result, "too_much_memory", f"{what} {fmt_bytes(metric)} 是起始代码（{fmt_bytes(base_metric)}）的 "
                                               f"{metric / base_metric:.2f} 倍，目标是不超过 {spec.target_ratio:.2f} 倍")
    if case == "moe":
        if sp.get("flops") is None:
            return fail(result, "tamper", "结果文件里没有矩阵乘的计算量：结果被改写了")
        why = _moe_flops(spec, result, bp, sp)
        if why:
            return fail(result, "technique", why)
    ranks = sp.get("rank_peak_bytes")
    per_rank = f"（各 rank 峰值 {'、'.join(fmt_bytes(x) for x in ranks)}）" if ranks else ""
    work = f"，矩阵乘计算量是起始代码的 {result['flops_ratio']:.2f} 倍" if "flops_ratio" in result else ""
    return passed(spec, result, f"{what}是起始代码的 {result['ratio']:.2f} 倍（目标 ≤ {spec.target_ratio:.2f}）"
                                f"{per_rank}{work}，结果与起始代码一致")


def _moe_flops(spec, result: dict, bp: dict, sp: dict) -> str | None:
    """Why the experts did too much work (every expert on every token), or None."""
    settings = getattr(spec, result.get("scale") or "ci").settings
    if not isinstance(bp.get("flops"), int) or bp["flops"] <= 0:
        raise BaselineBroken("case moe: the starter's run reported no FLOPs")
    share = min(1.0, MOE_FLOP_SLACK * settings.top_k / settings.experts)
    result["flops_ratio"] = round(sp["flops"] / bp["flops"], 4)
    if sp["flops"] <= share * bp["flops"]:
        return None
    return (f"矩阵乘的计算量是起始代码（每个专家处理全部 token）的 {sp['flops'] / bp['flops']:.2f} 倍："
            f"每个 token 只选了 {settings.top_k} 个专家，专家部分的计算量应当在起始代码的 "
            f"{settings.top_k}/{settings.experts} 左右，允许到 {share:.2f} 倍。显存已经达标，但专家们仍在处理没有选中它们的 token")


def criteria_zh(spec) -> list[str]:
    lines = [*ranks_lines(spec), f"- **正确**：返回的结果与起始代码一致（相对误差 ≤ {spec.rtol:g}）；", *memory_lines(spec)]
    if getattr(spec.ci.settings, "case", None) == "moe":
        lines.append(f"- **计算量**：矩阵乘的浮点运算次数（`torch.utils.flop_counter` 计数）不超过起始代码的 "
                     f"{MOE_FLOP_SLACK:g} × top_k / 专家数 倍（封顶 1 倍）；起始代码让每个专家处理全部 token。")
    return lines
