"""The technique an exercise requires (spec.technique), observed while the learner trains.

Child side, `Probe`: torch's own hooks, installed by trusted code before the learner's code loads,
record per training step
- the model's forwards, and whether autocast was on for the device at each (accumulation, autocast);
- forwards of any module inside a Transformer block that run DURING backward (the autograd engine
  is executing a node): that is recomputation, however it is written (checkpoint);
- the bytes autograd saved for backward while a block ran its forward (a saved-tensors hook);
  checkpointing saves (almost) nothing there, and the trusted starter's figure is the yardstick;
- the dtypes of parameters, gradients and optimizer state at every optimizer step (autocast).
Parent side, `missing(spec, bp, sp)`: None, or what was observed and what to look at (Chinese).
The probe's figures come from the learner's process, so they are claims; the memory target,
judged on the same run, is what a forged claim cannot buy.
"""
from __future__ import annotations

import contextlib

from .common import INT, STR, list_of, record

BLOCK_SUFFIXES = ("Block", "Layer", "DecoderLayer")    # GPT2Block, BertLayer, LlamaDecoderLayer, ...
SAVED_SHARE_MAX = 0.6       # checkpointing every other block saves ~0.5 of the starter's bytes


class Probe:
    def __init__(self, h, model):
        torch = self.torch = h.torch
        self.h, self.model, self.device_type = h, model, h.dev.type
        blocks = [m for m in model.modules() if type(m).__name__.endswith(BLOCK_SUFFIXES)]
        self.blocks = {id(b) for b in blocks}
        self.inside = {id(m) for b in blocks for m in b.modules()}
        self.param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
        self.node = torch._C._current_autograd_node
        self.step_record: dict | None = None
        self.steps: list[dict] = []
        self.depth = 0                           # > 0 while a block's forward runs
        self.dtypes = {"parameters": set(), "gradients": set(), "optimizer_state": set()}
        self.autocast_dtypes: set[str] = set()
        import torch.nn.modules.module as nn_hooks          # (torch.optim deletes its `optimizer` attribute)
        import torch.optim.optimizer as optim_hooks
        self.handles = [
            (nn_hooks._global_forward_pre_hooks, nn_hooks.register_module_forward_pre_hook(self._pre)),
            (nn_hooks._global_forward_hooks, nn_hooks.register_module_forward_hook(self._post, always_call=True)),
            (optim_hooks._global_optimizer_pre_hooks, optim_hooks.register_optimizer_step_pre_hook(self._step_pre)),
            (optim_hooks._global_optimizer_post_hooks, optim_hooks.register_optimizer_step_post_hook(self._step_post)),
        ]

    @contextlib.contextmanager
    def step(self):
        """Around one call of the learner's step (entered by trusted code, outside `h.call`)."""
        self.step_record = {"forwards": 0, "autocast": 0, "recomputed": 0, "block_saved_bytes": 0}
        self.depth = 0
        try:
            with self.torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            self.steps.append(self.step_record)
            self.step_record = None

    # -- hooks (they run inside learner code: keep them small and side-effect free) ---------------
    def _pre(self, module, args):
        rec = self.step_record
        if rec is None:
            return
        mid = id(module)
        if mid in self.blocks:
            self.depth += 1
        if self.node() is not None:
            if mid in self.inside:
                rec["recomputed"] += 1
        elif module is self.model:
            rec["forwards"] += 1
            if self.torch.is_autocast_enabled(self.device_type):
                rec["autocast"] += 1
                self.autocast_dtypes.add(str(self.torch.get_autocast_dtype(self.device_type)))

    def _post(self, module, args, output):
        if self.step_record is not None and id(module) in self.blocks and self.depth:
            self.depth -= 1

    def _pack(self, t):
        rec = self.step_record
        if rec is not None and self.depth and self.node() is None:
            try:
                if t.untyped_storage()._cdata not in self.param_storages:
                    rec["block_saved_bytes"] += t.numel() * t.element_size()
            except Exception:   # a tensor without a plain storage: not what this figure is about
                pass
        return t

    def _step_pre(self, optimizer, args, kwargs):
        if self.step_record is None:
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.dtypes["parameters"].add(str(p.dtype))
                if p.grad is not None:
                    self.dtypes["gradients"].add(str(p.grad.dtype))

    def _step_post(self, optimizer, args, kwargs):
        if self.step_record is None:
            return
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, self.torch.Tensor) and v.is_floating_point():
                    self.dtypes["optimizer_state"].add(str(v.dtype))

    # -- the payload ------------------------------------------------------------------------------
    def report(self) -> dict:
        for registry, handle in self.handles:
            if handle.id not in registry:
                self.h.violate("tamper", "评分器观察训练方法的钩子被移除")
        final = {str(p.dtype) for p in self.model.parameters()}
        return {"steps": self.steps, "blocks": len(self.blocks), "autocast_dtypes": sorted(self.autocast_dtypes),
                "dtypes": {k: sorted(v) for k, v in self.dtypes.items()}, "final_parameter_dtypes": sorted(final)}


def _unpack(t):
    return t


# ---- parent side ------------------------------------------------------------------------------------
STEP = record(forwards=INT, autocast=INT, recomputed=INT, block_saved_bytes=INT)
DTYPES = list_of(STR, 64)
PAYLOAD = record(steps=list_of(STEP, 10_000), blocks=INT, autocast_dtypes=DTYPES,
                 dtypes=record(parameters=DTYPES, gradients=DTYPES, optimizer_state=DTYPES),
                 final_parameter_dtypes=DTYPES)


def _accumulation(bp: dict, mine: dict) -> str | None:
    forwards = [s["forwards"] for s in mine["steps"]]
    if any(n < 2 for n in forwards):
        return ("本题要求梯度累积：每次 train_step 里要把 batch 分成至少 2 个微批次，分别调用模型前向"
                f"（测到每步的前向次数 {forwards}）")
    return None


def _autocast(bp: dict, mine: dict) -> str | None:
    problems = []
    on = [s["autocast"] for s in mine["steps"]]
    if any(n < 1 for n in on):
        problems.append("模型的前向没有在自动混合精度（autocast）打开的状态下运行"
                        f"（测到每步在混合精度下的前向次数 {on}）。低精度只管它作用范围里的前向；"
                        "设备类型要取自 device.type，模拟设备上它是 \"cpu\"")
    d = mine["dtypes"]
    found = {"参数": set(d["parameters"]) | set(mine["final_parameter_dtypes"]), "梯度": set(d["gradients"]),
             "优化器状态": set(d["optimizer_state"])}
    low = {what: sorted(v - {"torch.float32"}) for what, v in found.items() if v - {"torch.float32"}}
    if low:
        seen = "；".join(f"{what}：{'、'.join(v)}" for what, v in low.items())
        problems.append(f"参数、梯度和优化器状态要保持 float32（主权重），测到了非 float32 的张量（{seen}）。"
                        "把模型整体转成 16 位是纯低精度训练，更新会丢精度")
    if problems:
        return "本题要求混合精度：" + "；另外，".join(problems)
    return None


def _checkpoint(bp: dict, mine: dict) -> str | None:
    recomputed = [s["recomputed"] for s in mine["steps"]]
    if any(n < 1 for n in recomputed):
        return ("本题要求激活检查点：反向时要重新计算 Transformer block 的前向，但在反向过程中没有检测到 block 内的模块"
                f"被重新执行（每步 {recomputed} 次）。要让 block 的前向在反向时重跑，而不是为反向保存中间结果；"
                "多调一次前向、或梯度累积都不是重算")
    base = sum(s["block_saved_bytes"] for s in bp["steps"])
    saved = sum(s["block_saved_bytes"] for s in mine["steps"])
    if base and saved > SAVED_SHARE_MAX * base:
        return (f"检测到了重算，但 block 前向里为反向保存的张量仍有起始代码的 {saved / base:.0%}（允许不超过 "
                f"{SAVED_SHARE_MAX:.0%}）：检查点要包住 block 的前向，block 里面就不再为反向保存激活值。"
                "是不是只包住了少数几个 block，或者检查点外面又正常前向了一遍？")
    return None


CHECKS = {"accumulation": _accumulation, "autocast": _autocast, "checkpoint": _checkpoint}

CRITERIA_ZH = {
    "accumulation": "- **方法对**：每一步把 batch 分成至少 2 个微批次，分别前向、反向（评分器数每步的模型前向次数）；",
    "autocast": ("- **方法对**：模型的前向在自动混合精度打开的状态下运行（评分器在每次模型前向时检查），"
                 "参数、梯度和优化器状态保持 float32（评分器在每次 `optimizer.step()` 时检查 dtype）；"),
    "checkpoint": ("- **方法对**：反向时重新计算 Transformer block 的前向，block 的前向不为反向保存激活值"
                   f"（评分器观察反向中的重算，并要求 block 内保存的字节不超过起始代码的 {SAVED_SHARE_MAX:.0%}）；"),
}


def missing(spec, bp: dict, sp: dict) -> str | None:
    """None when the required technique was observed (or none is required), else why not.
    `sp["technique"]` must already have the shape of PAYLOAD."""
    if not spec.technique:
        return None
    return CHECKS[spec.technique](bp["technique"], sp["technique"])
