"""Turn a `Workload` into a training step on a device, exactly as the reference table describes:

a model from its config (random weights), a random token batch with labels = input_ids, and per
step `loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)` (with `accum` micro-batches
per optimizer step). `measure_workload` runs it on the simulated device or on CUDA.
"""
from __future__ import annotations

import contextlib

import torch

from .meter import Measurement, measure_steps, open_device
from .models import build_model, get_preset
from .workload import Workload, WorkloadError

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_optimizer(name: str, params, foreach: bool = True):
    params = [p for p in params if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=foreach)
    if name == "sgdm":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=foreach)
    if name == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as e:
            raise WorkloadError("测量 adamw8bit 需要安装 bitsandbytes（pip install bitsandbytes）；"
                                "只做估算请用 vramlab estimate") from e
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    raise WorkloadError(f"未知优化器 {name!r}")


def _apply_lora(model, w: Workload):
    from peft import LoraConfig, get_peft_model

    family = get_preset(w.model).family
    targets = {"gpt2": ["c_attn"], "bert": ["query", "value"]}.get(family, ["q_proj", "v_proj"])
    cfg = LoraConfig(r=w.lora_rank, lora_alpha=2 * w.lora_rank, target_modules=targets, lora_dropout=0.0,
                     fan_in_fan_out=(family == "gpt2"))
    return get_peft_model(model, cfg)


def _checkpoint_attention(model):
    """Selective checkpointing (Korthikanti et al., 2022): recompute only the attention core."""
    from torch.utils.checkpoint import checkpoint

    for module in model.modules():
        if type(module).__name__.endswith("Attention") and not getattr(module, "_vramlab_ckpt", False):
            forward = module.forward

            def wrapped(*args, _f=forward, **kwargs):
                return checkpoint(_f, *args, use_reentrant=False, **kwargs)
            module.forward = wrapped
            module._vramlab_ckpt = True


def build_training(w: Workload, device, seed: int = 0):
    """Model, optimizer and a `step()` callable for workload `w`, created on `device`.

    Call inside the device's context (`with device:`) so every tensor is on it."""
    w.validate()
    if w.zero or w.gpus > 1:
        raise WorkloadError("measure 在单个进程里运行，不能模拟 --zero/--gpus；多卡显存请用 "
                            "vramlab estimate，或第 10 章的多进程示例")
    model = build_model(w.model, attention=w.attention, dropout=w.dropout, seed=seed,
                        dtype=_DTYPES[w.param_dtype_name], device=device.torch_device)
    if w.lora_rank:
        model = _apply_lora(model, w)
    if w.checkpointing == "full":
        model.gradient_checkpointing_enable()
    elif w.checkpointing == "selective":
        _checkpoint_attention(model)
    model.train(not w.inference)
    vocab = get_preset(w.model).vocab
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, vocab, (w.batch, w.seq), generator=gen).to(device.torch_device)
               for _ in range(w.accum)]

    if w.inference:
        def step():
            with torch.inference_mode():
                logits = model(input_ids=batches[0]).logits
                return None if getattr(device, "fake", False) else float(logits.float().mean())
        return model, None, step

    opt = make_optimizer(w.optimizer, model.parameters(), foreach=w.foreach)
    scaler = torch.amp.GradScaler(device.type) if w.precision == "fp16-mixed" else None
    autocast = (torch.autocast(device.type, dtype=_DTYPES[w.compute_dtype_name]) if w.mixed
                else contextlib.nullcontext())
    offload = device.save_on_cpu() if w.offload == "activations" else contextlib.nullcontext()

    def step():
        losses = []
        for ids in batches:
            with offload:
                with autocast:
                    loss = model(input_ids=ids, labels=ids).loss / w.accum
                (scaler.scale(loss) if scaler else loss).backward()
            losses.append(loss.detach())
            del loss
        if scaler and getattr(device, "fake", False):
            scaler.unscale_(opt)        # fake tensors have no values: take the step unconditionally
            opt.step()
            scaler.update()
        elif scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return None if getattr(device, "fake", False) else float(sum(losses))
    return model, opt, step


def measure_workload(w: Workload, backend: str = "sim", fake: bool = False, steps: int = 2,
                     warmup: int = 1, timeline: bool = False) -> Measurement:
    """Steady-state peak of `w`: `warmup` steps, then the peak over `steps` more (as the reference)."""
    with open_device(backend, fake=fake, timeline=timeline) as dev:
        model, opt, step = build_training(w, dev)
        m = measure_steps(step, dev, warmup=warmup, steps=steps)
        m.workload = w.to_dict()
        m.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return m
