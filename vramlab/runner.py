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


# peft target_modules for each choice of Workload.lora_targets (vramlab.workload.LORA_TARGETS).
# A list names module suffixes; a string is a regular expression peft matches against the full name.
PEFT_TARGETS = {
    "default": {"gpt2": ["c_attn"], "bert": ["query", "value"], "llama": ["q_proj", "v_proj"],
                "mixtral": ["q_proj", "v_proj"]},
    "qkvo": {"gpt2": r".*\.attn\.(c_attn|c_proj)", "bert": r".*\.attention\.(self\.(query|key|value)|output\.dense)",
             "llama": ["q_proj", "k_proj", "v_proj", "o_proj"], "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    # peft's own "all-linear" would, on transformers 5's Mixtral, also adapt the router and the 3-D
    # expert weights (target_parameters, materialising every expert's full ΔW); vramlab's all-linear
    # is the nn.Linear (GPT-2: Conv1D) layers only, named here, never the output layer.
    "all-linear": {"gpt2": ["c_attn", "c_proj", "c_fc"], "bert": ["query", "key", "value", "dense"],
                   "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                   "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"]},
}


def _apply_lora(model, w: Workload):
    from peft import LoraConfig, get_peft_model

    family = get_preset(w.model).family
    targets = PEFT_TARGETS[w.lora_targets][family]
    if w.qlora:
        _prepare_for_kbit_training(model, _DTYPES[w.compute_dtype_name])
    cfg = LoraConfig(r=w.lora_rank, lora_alpha=2 * w.lora_rank, target_modules=targets, lora_dropout=0.0,
                     fan_in_fan_out=(family == "gpt2"))
    return get_peft_model(model, cfg)


def _prepare_for_kbit_training(model, compute_dtype) -> None:
    """The QLoRA recipe on the NF4 stand-in (vramlab.sim.nf4), as peft and bitsandbytes run it:

    * `peft.prepare_model_for_kbit_training` freezes every parameter and casts every fp16/bf16
      parameter that is not 4-bit (embeddings, norms, the LM head, biases) to fp32 (peft 0.21,
      peft/utils/other.py). Called here with use_gradient_checkpointing=False: the workload's
      --checkpointing decides that (peft's default would switch on full checkpointing).
    * bitsandbytes' `Linear4bit.forward` (bitsandbytes/nn/modules.py, 0.50) casts its input to
      `bnb_4bit_compute_dtype` and its output back to the input's dtype: `x.to(compute_dtype)`,
      the 4-bit matmul, `.to(inp_dtype)`. The stand-in does the matmul in its input's dtype, so
      the two casts are added as forward hooks. The compute dtype is the workload's (bf16 for
      bf16 and bf16-mixed, fp16 for fp16 and fp16-mixed, fp32 for fp32).
    """
    from peft import prepare_model_for_kbit_training

    from .sim.nf4 import NF4Linear

    prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)

    def to_compute(module, args):
        module._vramlab_input_dtype = args[0].dtype
        return (args[0].to(compute_dtype),) + tuple(args[1:])

    def back_to_input(module, args, out):
        return out.to(module._vramlab_input_dtype)

    for m in model.modules():
        if isinstance(m, NF4Linear):
            m.register_forward_pre_hook(to_compute)
            m.register_forward_hook(back_to_input)


def _checkpoint_attention(model):
    """Selective checkpointing as vramlab defines it (the estimator counts the same tensors):
    recompute each block's attention module (`torch.utils.checkpoint`, non-reentrant) in backward,
    i.e. its q/k/v and output projections and the attention core, keeping only the module's
    input. This is what chapter 7's tutorial measures; Korthikanti et al. (2022)'s selective
    recomputation keeps the projections and recomputes only the core. Only the outermost module
    whose class name ends in "Attention" is wrapped (BERT: BertAttention, which holds
    BertSelfAttention, the output projection and the post-attention LayerNorm)."""
    from torch.utils.checkpoint import checkpoint

    def wrap(module):
        if type(module).__name__.endswith("Attention"):
            if not getattr(module, "_vramlab_ckpt", False):
                forward = module.forward

                def wrapped(*args, _f=forward, **kwargs):
                    return checkpoint(_f, *args, use_reentrant=False, **kwargs)
                module.forward = wrapped
                module._vramlab_ckpt = True
            return
        for child in module.children():
            wrap(child)
    wrap(model)


def build_training(w: Workload, device, seed: int = 0):
    """Model, optimizer and a `step()` callable for workload `w`, created on `device`.

    Call inside the device's context (`with device:`) so every tensor is on it."""
    w.validate()
    if w.zero or w.gpus > 1:
        raise WorkloadError("measure 在单个进程里运行，不能模拟 --zero/--gpus；多卡显存请用 "
                            "vramlab estimate，或第 10 章的多进程示例")
    build = build_model
    if w.qlora:
        if getattr(device, "backend", "") != "sim":
            raise WorkloadError("QLoRA 只能在模拟设备上测量（NF4 替身，vramlab.sim.nf4）；真实 GPU 上请用 "
                                "bitsandbytes 的 BitsAndBytesConfig 自己加载模型")
        from .sim.nf4 import quantized_build as build
    model = build(w.model, attention=w.attention, dropout=w.dropout, seed=seed,
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
