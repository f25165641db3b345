"""The technique an exercise requires (spec.technique), observed while the learner trains.

Child side, `Probe`. A technique is observed where it lives, at the Transformer blocks, and where the
learner's own hooks cannot stand in front of the observer: at the dispatch layer, which every aten
op passes, and at the simulated device's meter, which every storage passes. Per training step:
- every matrix multiply that has a block's weight as an operand (or a cast copy of one): in the
  forward, its output dtype (autocast) and how many tokens it multiplied (accumulation); during
  backward with grad mode on, a recomputation (checkpoint);
- the forward -> backward transitions: the first storage the device allocates while the autograd
  engine runs a node, after forward work. There the probe reads what the forward left on the
  device: all bytes allocated since the probe started, less gradients, optimizer state and cuBLAS
  workspaces ("saved_total"), and the part of it created outside the blocks ("saved_outside":
  embeddings, logits, the loss). Saved-tensor hooks of the learner's cannot hide a byte from
  this: whatever they keep on the device is allocated there; what they move off it is the
  parent's memory reading's business (a cgroup charges host memory, memfd and shared memory alike);
- the dtypes of parameters, gradients and optimizer state at every optimizer step (autocast).
Module forward hooks (global, installed before the learner's code loads) add the recomputations of
block modules during backward and tell the probe when it is inside a block.

A learner could pop the probe's dispatch mode off the stack to hide work from it. The checks need
positive observations measured against the trusted starter's (as many block matmuls, every token
through the blocks), so hiding fails them, and on the simulated device the meter's count of new
storages is compared with the probe's: a gap is tampering.

Parent side, `missing(spec, bp, sp)`: None, or what was observed and what to look at (Chinese).
"""
from __future__ import annotations

import contextlib
import weakref

from .common import INT, STR, list_of, record

BLOCK_SUFFIXES = ("Block", "Layer", "DecoderLayer")    # GPT2Block, BertLayer, LlamaDecoderLayer, ...
SAVED_SHARE_MAX = 0.6       # checkpointing every other block leaves ~0.5 of the starter's block bytes
LOW_SHARE_MIN = 0.9         # share of the blocks' forward matmuls that must run in 16 bits (autocast)
MICRO_SHARE_MAX = 0.75      # the largest micro-batch, as a share of the batch's tokens (accumulation)
UNSEEN_SLACK = 32           # new storages the meter may count and the probe not (storages resized by set_)
_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul", "linear")
_CASTS = ("_to_copy", "clone", "contiguous")
_LOW = ("torch.bfloat16", "torch.float16")


def _mode_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    node = torch._C._current_autograd_node
    grad_on = torch.is_grad_enabled
    aten = torch.ops.aten
    matmuls = {getattr(aten, n) for n in _MATMULS if hasattr(aten, n)}
    casts = {getattr(aten, n) for n in _CASTS if hasattr(aten, n)}

    class ProbeMode(TorchDispatchMode):
        """The probe's eyes at the dispatch layer (see the module docstring)."""

        def __init__(self, probe):
            super().__init__()
            self.p = probe

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            p = self.p
            kwargs = kwargs or {}
            live = p.live
            before = len(live) if live is not None else 0
            if p.rec is None or p.in_optimizer:
                out = func(*args, **kwargs)
                if live is not None:
                    p.seen += len(live) - before
                return out
            packet = func.overloadpacket
            if node() is not None:                       # the autograd engine runs a node: backward
                if p.seg_open:
                    p.transition()
                if packet in matmuls and grad_on() and p.weight_operand(args)[0] is not None:
                    p.rec["recomputed"] += 1            # a forward matmul of a block, rerun inside backward
                out = func(*args, **kwargs)
                if packet in casts:
                    p.note_cast(args, out)
            else:
                p.seg_open = True
                if packet in matmuls:
                    out = func(*args, **kwargs)
                    p.forward_matmul(args, out)
                elif packet in casts:
                    out = func(*args, **kwargs)
                    p.note_cast(args, out)
                else:
                    out = func(*args, **kwargs)
                if not p.depth:
                    p.note_outside(args, kwargs, out)
            if live is not None:
                p.seen += len(live) - before
            return out
    return ProbeMode


class Probe:
    def __init__(self, h, model):
        torch = self.torch = h.torch
        self.h, self.model, self.device_type = h, model, h.dev.type
        blocks = [m for m in model.modules() if type(m).__name__.endswith(BLOCK_SUFFIXES)]
        self.blocks = {id(b) for b in blocks}
        self.inside = {id(m) for b in blocks for m in b.modules()}
        self.block_keys = {p.untyped_storage()._cdata for b in blocks for p in b.parameters()}
        self.params = list(model.parameters())
        self.casts: dict[int, tuple[int, weakref.ref]] = {}    # copy's storage -> (weight's storage, ref)
        self.outside: dict[int, tuple[int, weakref.ref]] = {}  # forward storages made outside the blocks
        self.node = torch._C._current_autograd_node
        self.sim = bool(getattr(h, "sim", False))
        dev = h.dev
        self.allocated = dev.allocated                         # bound now: the learner may rebind it later
        self.baseline = int(self.allocated())                  # the model, the batches: not the learner's
        self.live = dev.tracker.live if self.sim else None
        self.workspaces = getattr(dev, "_workspaces", {}) if self.sim else {}
        self.optimizers: "weakref.WeakSet" = weakref.WeakSet()
        self.rec: dict | None = None
        self.steps: list[dict] = []
        self.depth = 0                                         # > 0 while a block (or a module in one) runs
        self.seg_open = False                                  # forward work since the last transition
        self.seg_rows: dict[int, int] = {}                     # block weight -> tokens multiplied this segment
        self.in_optimizer = 0
        self.seen = self.tracked = 0
        self.dtypes = {"parameters": set(), "gradients": set(), "optimizer_state": set()}
        self.autocast_dtypes: set[str] = set()
        self.mode = _mode_class(torch)(self)
        import torch.nn.modules.module as nn_hooks          # (torch.optim deletes its `optimizer` attribute)
        import torch.optim.optimizer as optim_hooks
        self.handles = [
            (nn_hooks._global_forward_pre_hooks, nn_hooks.register_module_forward_pre_hook(self._pre)),
            (nn_hooks._global_forward_hooks, nn_hooks.register_module_forward_hook(self._post, always_call=True)),
            (optim_hooks._global_optimizer_pre_hooks, optim_hooks.register_optimizer_step_pre_hook(self._step_pre)),
            (optim_hooks._global_optimizer_post_hooks, optim_hooks.register_optimizer_step_post_hook(self._step_post)),
        ]
        if self.sim:      # the meter asks the device for the phase of every storage it charges: listen there
            phase = dev.phase

            def phase_seen_by_probe():
                ph = phase()
                self._charged(ph)
                return ph
            dev.phase = phase_seen_by_probe

    @contextlib.contextmanager
    def step(self):
        """Around one call of the learner's step (entered by trusted code, outside `h.call`)."""
        self.rec = {"passes": [], "open_rows": 0, "block_matmuls": 0, "block_matmuls_low": 0, "recomputed": 0,
                    "transitions": 0, "saved_total": 0, "saved_outside": 0}
        self.depth, self.seg_open, self.seg_rows, self.outside = 0, False, {}, {}
        self.seen = self.tracked = self.in_optimizer = 0
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        try:
            with self.mode:
                try:
                    yield
                finally:
                    stack = _get_current_dispatch_mode_stack()
                    if not stack or stack[-1] is not self.mode:
                        self.h.violate("tamper", "评分器观察训练方法的分发模式（dispatch mode）被移走或被压在下面")
        finally:
            rec = self.rec
            rec["open_rows"] = max(self.seg_rows.values(), default=0)
            if self.sim and self.tracked - self.seen > UNSEEN_SLACK:
                self.h.violate("tamper", f"显存计量器记下了 {self.tracked} 个新存储，评分器的观察只看到 {self.seen} 个："
                                         "有运算绕过了评分器的分发模式")
            self.steps.append(rec)
            self.rec = None

    # -- observations (they run inside learner code: small, no tensor ops) --------------------------
    def transition(self):
        """Forward -> backward: what the forward left on the device (see the module docstring)."""
        self.seg_open = False
        rec = self.rec
        rows = max(self.seg_rows.values(), default=0)
        if rows:
            rec["passes"].append(rows)
        self.seg_rows = {}
        kept = int(self.allocated()) - self.baseline - self._state_bytes()
        outside = sum(n for n, ref in self.outside.values() if ref() is not None)
        self.outside = {}
        rec["transitions"] += 1
        rec["saved_total"] += max(kept, 0)
        rec["saved_outside"] += outside

    def _charged(self, phase: str):
        """The meter charged a new storage, created in `phase` (sim only)."""
        if self.rec is None:
            return
        self.tracked += 1
        if phase == "backward":
            if self.seg_open:
                self.transition()
        elif phase != "optimizer" and not self.in_optimizer:
            self.seg_open = True

    def _bytes(self, t) -> tuple[int, int]:
        st = t.untyped_storage()
        key = st._cdata
        if self.live is not None:
            rec = self.live.get(key)
            return key, (rec.charged if rec is not None else 0)
        return key, st.nbytes()

    def _state_bytes(self) -> int:
        """Gradients of the model's parameters, the optimizers' state for them, cuBLAS workspaces:
        on the device at a transition, but not what a forward leaves for its backward."""
        tensors = [p.grad for p in self.params if p.grad is not None]
        for opt in list(self.optimizers):
            for p in self.params:
                state = opt.state.get(p) if hasattr(opt, "state") else None
                if isinstance(state, dict):     # AdamW: step, exp_avg, exp_avg_sq (never more than a few)
                    tensors += [v for v in list(state.values())[:4]
                                if isinstance(v, self.torch.Tensor) and v.numel() <= p.numel()]
        tensors += list(self.workspaces.values())
        seen, total = set(), 0
        for t in tensors:
            try:
                key, n = self._bytes(t)
            except Exception:       # not a plain storage: nothing to subtract
                continue
            if key not in seen:
                seen.add(key)
                total += n
        return total

    def weight_operand(self, args):
        """(storage of the block weight among the operands or None, the other matrix operand, weight first?)."""
        weight, act, weight_first = None, None, False
        for a in args:
            if not isinstance(a, self.torch.Tensor):
                continue
            try:
                key = a.untyped_storage()._cdata
            except Exception:
                continue
            if key in self.block_keys:
                weight, weight_first = key, act is None
                continue
            hit = self.casts.get(key)
            if hit is not None and hit[1]() is not None:
                weight, weight_first = hit[0], act is None
                continue
            if act is None and a.dim() >= 2:
                act = a
        return weight, act, weight_first

    def forward_matmul(self, args, out):
        weight, act, weight_first = self.weight_operand(args)
        if weight is None:
            return
        rec = self.rec
        rec["block_matmuls"] += 1
        dtype = str(getattr(out, "dtype", ""))
        if dtype in _LOW:
            rec["block_matmuls_low"] += 1
            self.autocast_dtypes.add(dtype)
        if act is not None and act.dim() >= 2:
            rows = act.numel() // max(act.shape[-2] if weight_first else act.shape[-1], 1)
            self.seg_rows[weight] = self.seg_rows.get(weight, 0) + rows

    def note_cast(self, args, out):
        """A copy of a block weight (autocast's cached bf16 weight, a .to(), a clone) is that weight."""
        if not (args and isinstance(args[0], self.torch.Tensor) and isinstance(out, self.torch.Tensor)):
            return
        try:
            src = args[0].untyped_storage()._cdata
            st = out.untyped_storage()
        except Exception:
            return
        origin = src if src in self.block_keys else (self.casts[src][0] if src in self.casts else None)
        key = st._cdata
        if origin is None or key == src:
            return
        self.casts[key] = (origin, weakref.ref(st, lambda _r, key=key: self.casts.pop(key, None)))

    def note_outside(self, args, kwargs, out):
        """Storages a forward creates outside the blocks (embeddings, logits, loss)."""
        torch = self.torch
        outs = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (list, tuple)) else ())
                                                           if isinstance(t, torch.Tensor)]
        inputs = None
        for t in outs:
            try:
                st = t.untyped_storage()
                key, n = st._cdata, st.nbytes()
            except Exception:
                continue
            if not n or key in self.outside:
                continue
            if inputs is None:
                inputs = set()
                for a in list(args) + list(kwargs.values()):
                    if isinstance(a, torch.Tensor):
                        try:
                            inputs.add(a.untyped_storage()._cdata)
                        except Exception:
                            pass
            if key not in inputs:
                self.outside[key] = (n, weakref.ref(st))

    # -- hooks --------------------------------------------------------------------------------------
    def _pre(self, module, args):
        rec = self.rec
        if rec is None or id(module) not in self.inside:
            return
        self.depth += 1
        if self.node() is not None:
            rec["recomputed"] += 1

    def _post(self, module, args, output):
        if self.rec is not None and id(module) in self.inside and self.depth:
            self.depth -= 1

    def _step_pre(self, optimizer, args, kwargs):
        if self.rec is None:
            return
        self.in_optimizer += 1
        self.optimizers.add(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.dtypes["parameters"].add(str(p.dtype))
                if p.grad is not None:
                    self.dtypes["gradients"].add(str(p.grad.dtype))

    def _step_post(self, optimizer, args, kwargs):
        if self.rec is None:
            return
        self.in_optimizer = max(self.in_optimizer - 1, 0)
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, self.torch.Tensor) and v.is_floating_point():
                    self.dtypes["optimizer_state"].add(str(v.dtype))

    def close(self):
        """Remove the hooks and the device listener (in-process use; a grading child just exits)."""
        for _, handle in self.handles:
            handle.remove()
        if self.sim:
            vars(self.h.dev).pop("phase", None)

    # -- the payload ------------------------------------------------------------------------------
    def report(self) -> dict:
        for registry, handle in self.handles:
            if handle.id not in registry:
                self.h.violate("tamper", "评分器观察训练方法的钩子被移除")
        final = {str(p.dtype) for p in self.model.parameters()}
        return {"steps": self.steps, "blocks": len(self.blocks), "autocast_dtypes": sorted(self.autocast_dtypes),
                "dtypes": {k: sorted(v) for k, v in self.dtypes.items()}, "final_parameter_dtypes": sorted(final)}


# ---- parent side ------------------------------------------------------------------------------------
STEP = record(passes=list_of(INT, 10_000), open_rows=INT, block_matmuls=INT, block_matmuls_low=INT,
              recomputed=INT, transitions=INT, saved_total=INT, saved_outside=INT)
DTYPES = list_of(STR, 64)
PAYLOAD = record(steps=list_of(STEP, 10_000), blocks=INT, autocast_dtypes=DTYPES,
                 dtypes=record(parameters=DTYPES, gradients=DTYPES, optimizer_state=DTYPES),
                 final_parameter_dtypes=DTYPES)


def _pairs(starter: dict, mine: dict):
    """(starter's step, learner's step) for each step both ran (the harness runs the same number)."""
    return list(zip(starter["steps"], mine["steps"]))


def _tokens(step: dict) -> int:
    return sum(step["passes"]) + step["open_rows"]


def _accumulation(starter: dict, mine: dict) -> str | None:
    pairs = _pairs(starter, mine)
    passes = [len(s["passes"]) for _, s in pairs]
    if not pairs or any(n < 2 for n in passes):
        return ("本题要求梯度累积：每次 train_step 里要把 batch 分成至少 2 个微批次，每个微批次分别前向、再反向"
                f"（评分器在 Transformer block 的权重上数到每步“前向之后接反向”的次数 {passes}）。"
                "先把所有微批次都前向完、最后一起反向，激活值还是同时活着，不算")
    for i, (b, s) in enumerate(pairs, 1):
        full = _tokens(b)
        biggest = max(s["passes"] + [s["open_rows"]])
        if full and biggest > MICRO_SHARE_MAX * full:
            return (f"本题要求梯度累积：第 {i} 步有一次前向让整批 {full} 个 token 中的 {biggest} 个一起经过了 block"
                    f"（{biggest / full:.0%}，允许不超过 {MICRO_SHARE_MAX:.0%}）。每个微批次只含 batch 的一部分，"
                    "整批一起的前向（哪怕只是多跑一次、或者放在 no_grad 里之前）就不是累积了")
        if full and sum(s["passes"]) < full:
            return (f"本题要求梯度累积：第 {i} 步经过 block 并接着反向的 token 只有 {sum(s['passes'])} 个，"
                    f"整批有 {full} 个：每个样本都要在某个微批次里前向、反向")
    return None


def _autocast(starter: dict, mine: dict) -> str | None:
    problems = []
    pairs = _pairs(starter, mine)
    low = [s["block_matmuls_low"] for _, s in pairs]
    seen = [s["block_matmuls"] for _, s in pairs]
    need = [b["block_matmuls"] for b, _ in pairs]
    if not pairs or any(lo < LOW_SHARE_MIN * max(n, m) or not lo for lo, n, m in zip(low, seen, need)):
        problems.append("Transformer block 里的矩阵乘法没有用 16 位计算（评分器在 block 的权重上数矩阵乘法："
                        f"每步 {seen} 次，其中 16 位 {low} 次；起始代码的一次前向是每步 {need} 次，"
                        f"至少 {LOW_SHARE_MIN:.0%} 要是 16 位）。低精度只管它作用范围里、实际执行的运算；"
                        "设备类型要取自 device.type，模拟设备上它是 \"cpu\"")
    d = mine["dtypes"]
    found = {"参数": set(d["parameters"]) | set(mine["final_parameter_dtypes"]), "梯度": set(d["gradients"]),
             "优化器状态": set(d["optimizer_state"])}
    wrong = {what: sorted(v - {"torch.float32"}) for what, v in found.items() if v - {"torch.float32"}}
    if wrong:
        listed = "；".join(f"{what}：{'、'.join(v)}" for what, v in wrong.items())
        problems.append(f"参数、梯度和优化器状态要保持 float32（主权重），测到了非 float32 的张量（{listed}）。"
                        "把模型整体转成 16 位是纯低精度训练，更新会丢精度")
    if problems:
        return "本题要求混合精度：" + "；另外，".join(problems)
    return None


def block_bytes(starter: dict, mine: dict) -> tuple[int, int]:
    """(learner's, starter's) bytes the forward left on the device for the blocks, summed over the
    transitions of all steps. Outside the blocks the learner is credited at most what the starter
    keeps there, step by step (so nothing counted as "outside" can hide a block's activations)."""
    base = sum(max(b["saved_total"] - b["saved_outside"], 0) for b in starter["steps"])
    mine_bytes = sum(max(s["saved_total"] - min(s["saved_outside"], b["saved_outside"]), 0) for b, s in _pairs(starter, mine))
    return mine_bytes, base


def _checkpoint(starter: dict, mine: dict) -> str | None:
    pairs = _pairs(starter, mine)
    recomputed = [s["recomputed"] for _, s in pairs]
    if not pairs or any(n < 1 for n in recomputed):
        return ("本题要求激活检查点：反向时要重新计算 Transformer block 的前向，但在反向过程中没有检测到 block 内的模块"
                f"被重新执行（每步 {recomputed} 次）。要让 block 的前向在反向时重跑，而不是为反向保存中间结果；"
                "多调一次前向、或梯度累积都不是重算")
    if any(s["transitions"] < 1 for _, s in pairs):
        return "本题要求激活检查点：评分器没有观察到从前向进入反向的时刻（每步 " \
               f"{[s['transitions'] for _, s in pairs]} 次）：反向要由 autograd 在设备上执行"
    saved, base = block_bytes(starter, mine)
    if base and saved > SAVED_SHARE_MAX * base:
        return (f"检测到了重算，但反向开始时 block 的前向留在设备上的张量仍有起始代码的 {saved / base:.0%}（允许不超过 "
                f"{SAVED_SHARE_MAX:.0%}；评分器在每次从前向进入反向时读设备上的字节数，按样本数累计）："
                "检查点要包住 block 的前向，block 里面就不再为反向保存激活值。是不是只包住了少数几个 block，"
                "检查点外面又正常前向了一遍，或者用别的办法把激活值留在了设备上？")
    return None


CHECKS = {"accumulation": _accumulation, "autocast": _autocast, "checkpoint": _checkpoint}

CRITERIA_ZH = {
    "accumulation": ("- **方法对**：每一步把 batch 分成至少 2 个微批次，每个微批次分别前向、反向，没有哪次前向包含整批 "
                     f"{MICRO_SHARE_MAX:.0%} 以上的 token（评分器在 Transformer block 的权重上数每次前向相乘的 token）；"),
    "autocast": ("- **方法对**：Transformer block 里的矩阵乘法用 16 位计算（评分器在 block 的权重上看每次矩阵乘法的 dtype，"
                 f"至少 {LOW_SHARE_MIN:.0%}），参数、梯度和优化器状态保持 float32（评分器在每次 `optimizer.step()` 时检查 dtype）；"),
    "checkpoint": ("- **方法对**：反向时重新计算 Transformer block 的前向，block 的前向不为反向保存激活值"
                   "（评分器观察反向中的重算，并在每次从前向进入反向时读设备上 block 留下的字节，"
                   f"要求不超过起始代码的 {SAVED_SHARE_MAX:.0%}）；"),
}


def missing(spec, bp: dict, sp: dict) -> str | None:
    """None when the required technique was observed (or none is required), else why not.
    `sp["technique"]` must already have the shape of PAYLOAD."""
    if not spec.technique:
        return None
    return CHECKS[spec.technique](bp["technique"], sp["technique"])
