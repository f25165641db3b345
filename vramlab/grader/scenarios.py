"""What the grader's child runs for each exercise kind: one scenario per kind.

A scenario is called with the harness `h` BEFORE the guards are armed and the learner's code is
loaded (trusted setup: model, data, ground truth), and returns `run(fn)`, which calls the learner's
function only through `h.call` / `h.training_call` and returns the fields the parent judges
(`vramlab.grader.core.JUDGES`). The harness (`vramlab.grader.harness`) owns the guards; this module
owns the workloads.
"""
from __future__ import annotations


class WrongAnswer(ValueError):
    """What the learner's function returned is not an answer to the question (wrong type, shape,
    place, or side effect): graded "incorrect", with this message."""


def scenario_train_step(h):
    """`train_step(model, optimizer, batch, device)`: warm-up steps, then the steady peak."""
    job = h.job
    model, optimizer = h.training_setup()
    rows = h.rank_rows(int(job["batch"]))        # data parallel: this rank's share of every global batch
    batches = [b[rows].clone() for b in h.tokens((int(job["steps"]), int(job["batch"]), int(job["seq"])))]
    before = h.fingerprint(model.parameters())
    _learner_budget(h)

    def run(fn):
        losses, times, first_peak = [], [], 0
        h.reset_peak()
        for i, batch in enumerate(batches):
            if i == int(job["warmup"]):
                h.reset_peak()
            try:
                losses.append(h.training_call(lambda: float(fn(model, optimizer, batch, h.dev)), f"第 {i + 1} 步"))
            except h.torch.OutOfMemoryError as e:      # say which step: a leak overflows late, a big step at once
                raise h.torch.OutOfMemoryError(f"第 {i + 1} 步显存溢出（前面 {i} 步都放得下）。{e}") from None
            times.append(h.seconds)
            first_peak = first_peak or h.peak()
        return dict(h.training_result(before), peak_bytes=h.peak(), first_step_peak_bytes=first_peak, losses=losses,
                    step_seconds=min(times[int(job["warmup"]):] or times))
    return run


def _learner_budget(h):
    """ch21, ch30: the learner's run happens on a virtual card of extra["learner_budget_mib"]; the
    trusted starter runs without it (it is expected not to fit) and only gives the baseline."""
    mib = h.extra.get("learner_budget_mib")
    if mib and not h.job.get("reference"):
        h.dev.set_budget(int(float(mib) * 2 ** 20))


def scenario_distill_step(h):
    """ch23: `distill_step(student, teacher, optimizer, batch, device)`: the student (the job's model,
    trained by the grader's AdamW) learns from a bigger frozen teacher built from extra["teacher_config"]."""
    job = h.job
    student, optimizer = h.training_setup()
    teacher = h.build_model(h.extra["teacher_config"], seed=int(job["seed"]) + 7)
    h.payload["static_bytes"] += _nbytes(*teacher.parameters())
    rows = h.rank_rows(int(job["batch"]))
    batches = [b[rows].clone() for b in h.tokens((int(job["steps"]), int(job["batch"]), int(job["seq"])))]
    before, teacher_before = h.fingerprint(student.parameters()), h.fingerprint(teacher.parameters())

    def run(fn):
        losses, times = [], []
        h.reset_peak()
        for i, batch in enumerate(batches):
            if i == int(job["warmup"]):
                h.reset_peak()
            losses.append(h.training_call(lambda: float(fn(student, teacher, optimizer, batch, h.dev)), f"第 {i + 1} 步"))
            times.append(h.seconds)
        if h.fingerprint(teacher.parameters()) != teacher_before:
            raise WrongAnswer("教师模型的参数被改了：蒸馏只训练学生，教师要保持不变")
        return dict(h.training_result(before), peak_bytes=h.peak(), losses=losses,
                    step_seconds=min(times[int(job["warmup"]):] or times))
    return run


_PEFT_METHODS = {     # extra["method"] -> (peft config class name, use_dora, what the learner reads)
    "lora": ("LoraConfig", False, "LoRA（peft.LoraConfig）"),
    "dora": ("LoraConfig", True, "DoRA（peft.LoraConfig(use_dora=True)）"),
    "prompt_tuning": ("PromptTuningConfig", None, "Prompt Tuning（peft.PromptTuningConfig）"),
    "prefix_tuning": ("PrefixTuningConfig", None, "P-Tuning v2 / Prefix Tuning（peft.PrefixTuningConfig）"),
}


def _peft_method(prepared, method: str) -> str | None:
    """None when `prepared` is a peft model of the required method, else why not (Chinese)."""
    cls_name, dora, label = _PEFT_METHODS[method]
    configs = getattr(prepared, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return f"返回的不是 peft 模型：本题要求用 {label} 包装评分器给的模型（peft.get_peft_model）"
    cfg = configs.get(getattr(prepared, "active_adapter", "default")) or next(iter(configs.values()))
    if type(cfg).__name__ != cls_name or (dora is not None and bool(getattr(cfg, "use_dora", False)) != dora):
        return f"用的方法是 {type(cfg).__name__}{'（use_dora=True）' if getattr(cfg, 'use_dora', False) else ''}，本题要求 {label}"
    return None


def scenario_finetune(h):
    """ch24-27: `prepare_model(model)` returns the model to fine-tune (the starter: the model itself,
    full fine-tuning). The grader then builds AdamW over the parameters that require grad and runs
    the steps itself; the forward still runs under the guards (the model is the learner's)."""
    import peft  # noqa: F401  (imported by trusted code, before the guards)
    torch, job = h.torch, h.job
    model, _ = h.training_setup()
    params = list(model.parameters())
    h.payload["static_bytes"] = _nbytes(*params)          # the frozen base alone must stay on the device
    batch = h.tokens((int(job["batch"]), int(job["seq"])))     # one batch, every step: the loss must go down

    def run(fn):
        prepared = h.call(lambda: fn(model))
        if not isinstance(prepared, torch.nn.Module):
            raise WrongAnswer(f"prepare_model 应当返回 torch.nn.Module，实际返回了 {type(prepared).__name__}")
        mine = {id(p) for p in prepared.parameters()}
        if not all(id(p) in mine for p in params):
            raise WrongAnswer("返回的模型不包含评分器给你的那个模型的全部参数：要在它上面加适配器，不能换成别的模型")
        method = None if h.job.get("reference") else h.extra.get("method")     # the starter is full fine-tuning
        why_not = _peft_method(prepared, method) if method else None
        if why_not:
            raise WrongAnswer(why_not)
        trainable = [p for p in prepared.parameters() if p.requires_grad]
        total = sum(p.numel() for p in prepared.parameters())
        n_trainable = sum(p.numel() for p in trainable)
        if not trainable:
            raise WrongAnswer("没有任何参数 requires_grad=True：什么也训练不了")
        optimizer = torch.optim.AdamW(trainable, lr=float(job["lr"]), foreach=True)
        losses, times = [], []

        def step(batch):
            loss = prepared(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        h.reset_peak()
        for i in range(int(job["steps"])):
            if i == int(job["warmup"]):
                h.reset_peak()
            losses.append(h.call(lambda: step(batch)))
            times.append(h.seconds)
        return {"peak_bytes": h.peak(), "losses": losses, "trainable": n_trainable, "total": total,
                "step_seconds": min(times[int(job["warmup"]):] or times)}
    return run


def scenario_train_epoch(h):
    """`train_epoch(model, optimizer, tokens, device, batch_size)`: one pass over a dataset that
    lives in HOST memory; the peak covers the whole epoch."""
    job = h.job
    model, optimizer = h.training_setup()
    n, bs = int(h.extra["n_samples"]), int(job["batch"])
    data = h.tokens((n, int(job["seq"])), on_host=True)
    before = h.fingerprint(model.parameters())

    def run(fn):
        h.reset_peak()
        steps = -(-n // bs)
        losses = h.training_call(lambda: [float(x) for x in fn(model, optimizer, data, h.dev, bs)], "这个 epoch ",
                                 min_steps=steps)
        return dict(h.training_result(before), peak_bytes=h.peak(), losses=losses, step_seconds=h.seconds / steps)
    return run


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


def scenario_estimate(h):
    """`estimate_static_bytes(n_params, optimizer, precision)`: pure arithmetic. The trusted
    (reference) child measures the truth of every case on the simulated device; the learner's child
    only asks the function, which gets no device and must not create tensors on this one."""
    from vramlab.models import count_params

    cases = [tuple(c) for c in h.extra["cases"]]
    truths = None
    if h.job.get("reference"):
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


def scenario_monitor(h):
    """`measure_peak(fn, device)`: the peak (absolute `max_allocated`) while `fn()` runs. The truth
    of each hidden function is measured by the harness right before the learner measures it."""
    import random

    torch, dev = h.torch, h.dev
    model, optimizer = h.training_setup()
    batch = h.tokens((int(h.job["batch"]), int(h.job["seq"])))
    rng = random.Random(int(h.job.get("case_seed", 0)))
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


def scenario_load(h):
    """`load_model(device)`: the peak while the model is created, and the model it returns."""
    from vramlab.models import count_params

    torch = h.torch
    count_params(h.job["model"])      # import the model's code now (lazy imports touch os.environ)

    def run(fn):
        h.reset_peak()
        model = h.call(lambda: fn(h.dev))
        peak = h.peak()
        if not isinstance(model, torch.nn.Module):
            raise WrongAnswer(f"load_model 应当返回模型（torch.nn.Module），实际返回了 {type(model).__name__}")
        params = list(model.parameters())
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                    for t in [*params, *model.buffers()]}
        return {"peak_bytes": peak, "model_bytes": sum(storages.values()), "param_count": sum(p.numel() for p in params),
                "dtypes": sorted({str(p.dtype) for p in params}), "on_device": all(h.tracked(p) for p in params),
                "fingerprint": h.fingerprint(params)}
    return run


# ---- kind "call": one call of a function on prepared inputs, judged on its result and a memory metric
def _on_device(h, value, shape, what: str):
    """A returned tensor must have the expected shape and live on the device."""
    if not isinstance(value, h.torch.Tensor):
        raise WrongAnswer(f"{what} 应当返回张量，实际返回了 {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise WrongAnswer(f"{what} 返回的形状是 {tuple(value.shape)}，应当是 {tuple(shape)}")
    if not h.tracked(value):
        raise WrongAnswer(f"{what} 返回的张量不在设备上（显存里）：用 device.to_device() 把结果搬到设备上")
    return value


def _host_randn(h, *shape, scale: float = 1.0):
    """Seeded data created in host memory (a fresh generator per job keeps both runs identical)."""
    torch = h.torch
    with h.dev.host():
        return torch.randn(*shape, generator=h.gen) * scale


def _measured(h, thunk):
    """Call learner code from a fresh peak; returns (value, peak, peak reserved)."""
    h.reset_peak()
    value = h.call(thunk)
    return value, h.peak(), h.reserved_peak()


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def case_tp_mlp(h):
    """ch09: `tp_mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, device)` on every rank; the
    full weights live in host memory, x on the device; the full output on every rank."""
    d, b, s = int(h.extra["d_model"]), int(h.job["batch"]), int(h.job["seq"])
    weights = [_host_randn(h, 4 * d, d, scale=0.02), _host_randn(h, 4 * d, scale=0.02),
               _host_randn(h, d, 4 * d, scale=0.02), _host_randn(h, d, scale=0.02)]
    x = h.dev.to_device(_host_randn(h, b, s, d))

    def run(fn):
        y, peak, reserved = _measured(h, lambda: fn(x, *weights, h.dev))
        _on_device(h, y, (b, s, d), "tp_mlp")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": _nbytes(x, y)}
    return run


def case_eval_loop(h):
    """ch12: `evaluate(model, batches, device)`: the mean loss over batches already on the device;
    the model must come out unchanged."""
    model, _ = h.training_setup()
    n, b, s = int(h.extra["n_batches"]), int(h.job["batch"]), int(h.job["seq"])
    batches = list(h.tokens((n, b, s)))
    before = h.fingerprint(model.parameters())
    static = sum(_nbytes(p) for p in model.parameters())

    def run(fn):
        value, peak, reserved = _measured(h, lambda: float(fn(model, batches, h.dev)))
        if h.fingerprint(model.parameters()) != before:
            raise WrongAnswer("evaluate 改变了模型参数：评估只读不写")
        return {"outputs": [[value]], "peak_bytes": peak, "metric_bytes": peak, "floor_bytes": static}
    return run


def case_attention(h):
    """ch14: `attention(q, k, v)`, causal; the harness backpropagates a fixed random gradient."""
    b, s = int(h.job["batch"]), int(h.job["seq"])
    heads, hd = int(h.extra["heads"]), int(h.extra["head_dim"])
    q, k, v = (h.dev.to_device(_host_randn(h, b, heads, s, hd)).requires_grad_() for _ in range(3))
    return _backprop_case(h, lambda fn: fn(q, k, v), (b, heads, s, hd), "attention", (q, k, v))


def case_embedding(h):
    """ch15: `embed(ids, table, device)`: the table lives in host memory, ids on the device."""
    vocab, d, b, s = int(h.extra["vocab"]), int(h.extra["d_model"]), int(h.job["batch"]), int(h.job["seq"])
    table = _host_randn(h, vocab, d)
    with h.dev.host():
        ids_host = h.torch.randint(0, vocab, (b, s), generator=h.gen)
    ids = h.dev.to_device(ids_host)

    def run(fn):
        out, peak, reserved = _measured(h, lambda: fn(ids, table, h.dev))
        _on_device(h, out, (b, s, d), "embed")
        return {"outputs": [h.fingerprint([out])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": _nbytes(ids, out)}
    return run


def case_fragmentation(h):
    """ch11: `process(requests, weight, device)`: requests of growing length arrive in host memory;
    one result per request stays on the device. Metric: peak reserved minus peak allocated."""
    d = int(h.extra["d_model"])
    requests = [_host_randn(h, int(n), d) for n in h.extra["lengths"]]
    weight = h.dev.to_device(_host_randn(h, d, 4 * d, scale=0.05))

    def run(fn):
        outs, peak, reserved = _measured(h, lambda: fn(requests, weight, h.dev))
        if not isinstance(outs, (list, tuple)) or len(outs) != len(requests):
            raise WrongAnswer(f"process 应当返回 {len(requests)} 个结果的列表（每个请求一个，顺序不变）")
        for out, x in zip(outs, requests):
            _on_device(h, out, (x.shape[0], d), "process 的每个结果")
        return {"outputs": [h.fingerprint(list(outs))], "peak_bytes": peak, "reserved_peak_bytes": reserved,
                "metric_bytes": reserved - peak, "floor_bytes": _nbytes(weight, *outs)}
    return run


def _backprop_case(h, forward, out_shape, what: str, leaves, dtype=None):
    """`forward(fn)` runs the learner's function (once or more) and returns the output; backward
    with a fixed random gradient; the output and the gradient of every leaf are compared with the
    starter's."""
    grad_out = h.dev.to_device(_host_randn(h, *out_shape))
    if dtype is not None:
        grad_out = grad_out.to(dtype)

    def run(fn):
        def forward_backward():
            out = _on_device(h, forward(fn), out_shape, what)
            if not out.requires_grad:
                raise WrongAnswer(f"{what} 的输出不能求导：不要 detach，也不要在 no_grad 里计算")
            out.backward(grad_out)
            return out
        out, peak, reserved = _measured(h, forward_backward)
        grads = [t.grad for t in leaves]
        if any(g is None for g in grads):
            raise WrongAnswer(f"{what} 的输入没有都得到梯度：输出要能对每个输入求导")
        return {"outputs": [h.fingerprint([t]) for t in (out.detach(), *grads)], "peak_bytes": peak,
                "metric_bytes": peak, "floor_bytes": _nbytes(grad_out, *leaves, *grads)}
    return run


def case_gqa_attention(h):
    """ch16: `attention(q, k, v)` with fewer key/value heads than query heads (GQA), causal."""
    b, s = int(h.job["batch"]), int(h.job["seq"])
    hq, hkv, hd = int(h.extra["heads"]), int(h.extra["kv_heads"]), int(h.extra["head_dim"])
    dtype = getattr(h.torch, h.extra.get("dtype", "float32"))    # CUDA's GQA kernels need fp16/bf16
    q = h.dev.to_device(_host_randn(h, b, hq, s, hd)).to(dtype).requires_grad_()
    k, v = (h.dev.to_device(_host_randn(h, b, hkv, s, hd)).to(dtype).requires_grad_() for _ in range(2))
    return _backprop_case(h, lambda fn: fn(q, k, v), (b, hq, s, hd), "attention", (q, k, v), dtype=dtype)


def case_rms_norm(h):
    """ch18: `rms_norm(x, weight, eps)` in a residual stack of extra["layers"] pre-norm layers
    (h = h + rms_norm(h, w_i)), as in a Transformer: what each call saves for backward adds up
    over the layers, its temporaries do not."""
    dtype = getattr(h.torch, h.extra.get("dtype", "float32"))
    tokens, hidden = int(h.job["batch"]) * int(h.job["seq"]), int(h.extra["hidden"])
    x = h.dev.to_device(_host_randn(h, tokens, hidden)).to(dtype).requires_grad_()
    weights = [h.dev.to_device(1 + _host_randn(h, hidden, scale=0.1)).to(dtype).requires_grad_()
               for _ in range(int(h.extra.get("layers", 1)))]
    eps = float(h.extra.get("eps", 1e-6))

    def forward(fn):
        out = x
        for w in weights:
            out = out + fn(out, w, eps)
        return out
    return _backprop_case(h, forward, (tokens, hidden), "rms_norm", (x, *weights), dtype=dtype)


def case_int8_linear(h):
    """ch22: `int8_linear(x, weight_int8, scale)`: weight-only INT8 (per output channel), forward only."""
    torch = h.torch
    tokens, d_in, d_out = int(h.job["batch"]) * int(h.job["seq"]), int(h.extra["d_in"]), int(h.extra["d_out"])
    w = _host_randn(h, d_out, d_in, scale=0.02)
    with h.dev.host():
        scale = w.abs().amax(dim=1) / 127
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    x, weight_int8, scale = (h.dev.to_device(t) for t in (_host_randn(h, tokens, d_in), q, scale))

    def run(fn):
        y, peak, _ = _measured(h, lambda: fn(x, weight_int8, scale))
        _on_device(h, y, (tokens, d_out), "int8_linear")
        if y.dtype != x.dtype:
            raise WrongAnswer(f"int8_linear 返回的类型是 {y.dtype}，应当与 x 相同（{x.dtype}）")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": _nbytes(x, weight_int8, scale, y)}
    return run


def case_moe(h):
    """ch17: `moe_forward(x, router_weight, w_in, w_out, top_k)`: a top-k mixture of GELU experts
    on [tokens, d], forward only (inference)."""
    tokens, d = int(h.job["batch"]) * int(h.job["seq"]), int(h.extra["d_model"])
    experts, top_k = int(h.extra["experts"]), int(h.extra["top_k"])
    x = h.dev.to_device(_host_randn(h, tokens, d))
    router = h.dev.to_device(_host_randn(h, experts, d, scale=0.5))
    w_in = h.dev.to_device(_host_randn(h, experts, 4 * d, d, scale=0.05))
    w_out = h.dev.to_device(_host_randn(h, experts, d, 4 * d, scale=0.05))

    def run(fn):
        y, peak, reserved = _measured(h, lambda: fn(x, router, w_in, w_out, top_k))
        _on_device(h, y, (tokens, d), "moe_forward")
        return {"outputs": [h.fingerprint([y])], "peak_bytes": peak, "metric_bytes": peak,
                "floor_bytes": _nbytes(x, router, w_in, w_out, y)}
    return run


CALL_CASES = {"tp_mlp": case_tp_mlp, "eval_loop": case_eval_loop, "attention": case_attention,
              "embedding": case_embedding, "fragmentation": case_fragmentation, "gqa_attention": case_gqa_attention,
              "rms_norm": case_rms_norm, "moe": case_moe, "int8_linear": case_int8_linear}


def scenario_call(h):
    return CALL_CASES[h.extra["case"]](h)


def scenario_max_batch(h):
    """ch13: `find_max_batch(try_step, device)` on a virtual card. `try_step(n)` runs one training
    step with batch n (trusted code) and raises torch.OutOfMemoryError when it does not fit. After
    the learner answers, the harness itself checks that n fits and n + 1 does not."""
    torch, dev = h.torch, h.dev
    model, optimizer = h.training_setup()
    seq, largest = int(h.job["seq"]), int(h.extra["max_batch_allowed"])
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
    dev.set_budget(int(float(h.extra["budget_mib"]) * 2 ** 20))

    def run(fn):
        answer = h.call(lambda: fn(try_step, dev))
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise WrongAnswer(f"find_max_batch 应当返回整数，实际返回了 {answer!r}")
        verified = 1 <= answer < largest and fits(answer) and not fits(answer + 1)
        return {"answer": answer, "verified": bool(verified), "trials": trials,
                "peak_bytes": h.peak()}
    return run


SCENARIOS = {"train_step": scenario_train_step, "train_epoch": scenario_train_epoch, "estimate": scenario_estimate,
             "monitor": scenario_monitor, "load": scenario_load, "call": scenario_call,
             "max_batch": scenario_max_batch, "distill_step": scenario_distill_step, "finetune": scenario_finetune}


