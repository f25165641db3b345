"""Plan a fine-tune: which settings fit a card, and which of those is fastest?

    vramlab plan --config path/to/config.json --card 24GiB [--gpus N] [--seq S] [--global-batch B] [--json]
    python -m vramlab.plan --bench            # estimate vs simulated device for every sample config

The search. Every combination of the course's techniques is a `Workload` (plus a QLoRA flag):
precision (fp32, bf16-mixed, pure bf16), method (full fine-tuning, LoRA, QLoRA with `--lora-rank`),
optimizer (AdamW, 8-bit AdamW, Adafactor), activation checkpointing (none, selective, full),
activation offload (save_on_cpu), ZeRO stage 0-3 over `--gpus` (stage 3 = FSDP's full sharding),
and micro-batch x accumulation = global batch / GPUs (micro-batches are powers of two).
`vramlab.estimate` gives each one's peak; a candidate fits if that peak times the allocator's
typical overhead (the median reserved/allocated ratio of the H200 reference table) is at most the
card minus the CUDA context. Fitting candidates are ranked by `step_cost` (below); the best few are
then run for real shapes on the simulated device under FakeTensorMode with the card's budget
(single GPU only: the simulated device runs one process), and the micro-batch one size up is run
too, to show it would not fit.

The cost model (`step_cost`): seconds of one optimizer step on one GPU at peak rates, no overlap.
It ranks; it does not predict wall time (real steps reach a fraction of peak).

  compute     6·N FLOPs per token for training, N = weights in a matmul per token (Kaplan et al.
              2020, "Scaling Laws for Neural Language Models", Sec. 2.1: C ≈ 6N; forward 2N +
              2·n_layer·n_ctx·d_attn for attention, backward twice the forward). An MoE counts the
              experts a token visits (top-k of E).
  LoRA        frozen weights need no weight gradient: backward is 2N instead of 4N (Hu et al. 2021,
              "LoRA", Sec. 4.2 reports the resulting speed-up); the adapters' own FLOPs are added.
  full ckpt   +1 forward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
              Korthikanti et al. 2022, Sec. 5: full recomputation costs one extra forward, ~33 %).
  selective   +1 forward of the attention modules (projections + core), what vramlab's runner
              recomputes (`torch.utils.checkpoint` around each attention module).
  offload     save_on_cpu copies every saved activation to the host and back: 2x the activation
              bytes over PCIe.
  QLoRA       each pass over a layer first dequantises its NF4 weights (read 0.516 B, write 2 B per
              weight, Dettmers et al. 2023) at HBM bandwidth: forward, backward and any recompute.
  optimizer   memory-bound: every trainable parameter's weight, gradient and state are read and the
              weight and state written once, at HBM bandwidth.
  ZeRO        per optimizer step (Rajbhandari et al. 2020, "ZeRO", Sec. 7): data parallel and ZeRO-1
              all-reduce the gradients, 2Ψ; ZeRO-2 reduce-scatters gradients each micro-batch and
              all-gathers weights once, 2Ψ at accumulation 1; ZeRO-3 all-gathers the weights for the
              forward and again for the backward and reduce-scatters gradients, 3Ψ per micro-batch.
              Ring collectives move (N-1)/N of that per GPU over the GPU link.

Hardware constants (`Hardware`): an RTX 4090-class 24 GB card by default, from NVIDIA's "Ada GPU
Architecture" whitepaper, Appendix A (GeForce RTX 4090): 165.2 TFLOPS dense BF16 tensor with FP32
accumulate, 82.6 TFLOPS FP32 (PyTorch runs FP32 matmuls without TF32 by default), 1008 GB/s memory
bandwidth; PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction, which is also
the GPU-to-GPU link (no NVLink). Every constant can be overridden.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

from .estimate import (DTYPE_BYTES, Estimate, activation_bytes, estimate, linear_shapes, lora_params,
                       matmul_weight_params, param_count)
from .models import Preset, get_preset
from .units import MiB, fmt_bytes, parse_bytes
from .workload import Workload, WorkloadError

CONTEXT_BYTES = 700 * MiB      # CUDA context, outside the allocator: ~600-700 MiB on the H200 reference
PRECISIONS = ("bf16-mixed", "bf16", "fp32")
METHODS = ("full", "lora", "qlora")
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)     # estimate.qlora_weight_bytes per weight

PARETO_STEP = 0.02
CATEGORY_ZH = {"parameters": "模型参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
               "logits_and_loss": "logits 与损失", "temporaries": "临时张量", "cuda_overhead": "CUDA 开销"}

METHOD_ZH = {"full": "全参数微调", "lora": "LoRA", "qlora": "QLoRA"}
PRECISION_ZH = {"fp32": "FP32", "bf16-mixed": "BF16 混合精度（FP32 权重 + autocast）", "bf16": "纯 BF16 权重"}
OPTIMIZER_ZH = {"adamw": "AdamW", "adamw8bit": "8-bit AdamW", "adafactor": "Adafactor（分解的二阶矩）"}
CKPT_ZH = {"none": "不检查点", "selective": "选择性重算（注意力模块）", "full": "全量激活检查点"}


@dataclass(frozen=True)
class Hardware:
    name: str = "RTX 4090 级 24 GB 显卡（默认常数）"
    bf16_tflops: float = 165.2     # dense BF16 tensor, FP32 accumulate
    fp32_tflops: float = 82.6
    hbm_gbps: float = 1008.0
    pcie_gbps: float = 31.5        # host <-> device, per direction
    link_gbps: float = 31.5        # GPU <-> GPU (PCIe without NVLink)


@dataclass(frozen=True)
class Candidate:
    workload: Workload
    qlora: bool = False

    @property
    def method(self) -> str:
        return "qlora" if self.qlora else ("lora" if self.workload.lora_rank else "full")


@dataclass
class Scored:
    candidate: Candidate
    estimate: Estimate
    need_bytes: int                # estimated device bytes incl. allocator overhead (and DDP buckets)
    cost: dict                     # seconds per optimizer step, by part; "total"
    fits: bool

    @property
    def workload(self) -> Workload:
        return self.candidate.workload


# ---------------------------------------------------------------------------------------------
# Allocator overhead from the reference table
# ---------------------------------------------------------------------------------------------

def allocator_overhead() -> float:
    """Median of reserved / allocated peak over the H200 reference rows (the caching allocator keeps
    more than the tensors need: rounding, split blocks, cached free blocks)."""
    from .reference import reference_rows

    return statistics.median(r.reserved_mib / r.steady_mib for r in reference_rows())


# ---------------------------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------------------------

def _head_dim(p: Preset) -> int:
    return p.config.get("head_dim") or p.hidden // p.heads


def active_matmul_params(p: Preset) -> int:
    """Weights a token goes through in matmuls (the LM head included, MoE: only its top-k experts)."""
    n = matmul_weight_params(p)
    if p.family == "mixtral":
        e, k = p.config["num_local_experts"], p.config["num_experts_per_tok"]
        n -= p.n_layers * (e - k) * 3 * p.hidden * p.ffn_hidden
    return n


def attention_params(p: Preset) -> int:
    shapes = linear_shapes(p)
    return p.n_layers * sum(i * o for name, (i, o, _) in shapes.items() if name in ("qkv", "q", "k", "v", "o"))


def step_cost(c: Candidate, p: Preset, hw: Hardware) -> dict:
    """Seconds of one optimizer step on one GPU, by part (see the module docstring for sources)."""
    w = c.workload
    per_gpu = w.batch * w.accum
    tokens = per_gpu * w.seq
    n_mm = active_matmul_params(p)
    attn = 2 * p.n_layers * w.seq * p.heads * _head_dim(p)        # Kaplan's attention term, per token
    fwd = 2 * n_mm + attn
    lora = w.lora_rank > 0
    adapters = lora_params(p, w.lora_rank) if lora else 0
    train = (fwd + 2 * n_mm + 2 * attn + 6 * adapters) if lora else 3 * fwd
    if w.checkpointing == "full":
        recompute = fwd
    elif w.checkpointing == "selective":
        recompute = 2 * attention_params(p) + attn
    else:
        recompute = 0
    rate = (hw.fp32_tflops if w.precision == "fp32" else hw.bf16_tflops) * 1e12
    out = {"compute": tokens * train / rate, "recompute": tokens * recompute / rate}

    act = activation_bytes(replace(w, offload="none"), p) if w.offload == "activations" else 0
    out["offload"] = 2 * act * w.accum / (hw.pcie_gbps * 1e9)

    passes = 3 if w.checkpointing == "full" else 2
    out["dequant"] = (passes * matmul_weight_params(p) * (NF4_BYTES + 2) * w.accum / (hw.hbm_gbps * 1e9)
                      if c.qlora else 0.0)

    trainable = adapters if lora else param_count(p)
    wb = 2 if w.precision == "bf16" and not lora else 4        # adapters are fp32 (peft)
    state = {"adamw": 2 * wb, "adamw8bit": 2, "adafactor": 0, "sgd": 0, "sgdm": wb}[w.optimizer]
    if w.zero and w.mixed and not lora:
        state += 4                                            # fp32 master weights
    shard = w.gpus if w.zero else 1
    out["optimizer"] = trainable * (3 * wb + 2 * state) / shard / (hw.hbm_gbps * 1e9)

    comm = 0.0
    if w.gpus > 1:
        ring = (w.gpus - 1) / w.gpus
        gb = 2 if (w.mixed or w.precision == "bf16") and not lora else 4
        grads = trainable * gb
        if w.zero in (0, 1):
            comm = 2 * grads
        elif w.zero == 2:
            comm = grads * w.accum + trainable * gb
        else:
            weights = param_count(p) * (2 if w.precision != "fp32" else 4)
            comm = (2 * weights + grads) * w.accum
        comm *= ring
    out["communication"] = comm / (hw.link_gbps * 1e9)
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------

def micro_batches(per_gpu: int) -> list[int]:
    return [b for b in (2 ** i for i in range(0, 12)) if b <= per_gpu and per_gpu % b == 0]


def candidates(p: Preset, seq: int, global_batch: int, gpus: int, lora_rank: int = 16,
               methods=METHODS, precisions=PRECISIONS) -> list[Candidate]:
    per_gpu = global_batch // gpus
    out = []
    zeros = (0,) if gpus == 1 else (0, 1, 2, 3)
    for method in methods:
        precs = ("bf16",) if method == "qlora" else precisions
        optimizers = ("adamw", "adamw8bit", "adafactor") if method == "full" else ("adamw", "adamw8bit")
        for precision in precs:
            for optimizer in optimizers:
                for ckpt in ("none", "selective", "full"):
                    for offload in ("none", "activations"):
                        for zero in zeros:
                            for b in micro_batches(per_gpu):
                                w = Workload(model=p.name, batch=b, seq=seq, optimizer=optimizer, precision=precision,
                                             checkpointing=ckpt, lora_rank=0 if method == "full" else lora_rank,
                                             zero=zero, gpus=gpus, accum=per_gpu // b, offload=offload)
                                out.append(Candidate(w, qlora=method == "qlora"))
    return out


def qlora_head_correction(c: Candidate, p: Preset) -> int:
    """`estimate(w, qlora=True)` stores every matmul weight in NF4, the LM head included; bitsandbytes
    (transformers' BitsAndBytesConfig) keeps the output embedding in 16-bit. Add the difference."""
    if not c.qlora:
        return 0
    return int(p.vocab * p.hidden * (DTYPE_BYTES[c.workload.param_dtype_name] - NF4_BYTES))


def score(c: Candidate, p: Preset, usable: int, hw: Hardware, overhead: float) -> Scored:
    e = estimate(c.workload, qlora=c.qlora)
    need = e.total_bytes + qlora_head_correction(c, p)
    w = c.workload
    if w.gpus > 1 and w.zero == 0:
        # DDP's gradient buckets are a second copy of the gradients (gradient_as_bucket_view=False,
        # PyTorch's default; see torch.nn.parallel.DistributedDataParallel)
        need += lora_params(p, w.lora_rank) * 4 if w.lora_rank else e.trainable_params * (2 if w.precision == "bf16" else 4)
    need = int(need * overhead)
    return Scored(c, e, need, step_cost(c, p, hw), need <= usable)


# prefer, at equal cost: larger micro-batches (fewer, larger kernels), mixed precision over pure
# 16-bit weights (rounding of small updates), AdamW over approximations, less memory
_PREC_RANK = {"bf16-mixed": 0, "fp32": 1, "bf16": 2}
_OPT_RANK = {"adamw": 0, "adamw8bit": 1, "adafactor": 2}


def _key(s: Scored):
    w = s.workload
    return (round(s.cost["total"], 6), -w.batch, _PREC_RANK[w.precision], _OPT_RANK[w.optimizer], s.need_bytes)


def _family_key(s: Scored):
    """Candidates that differ only in micro-batch, optimizer or offload are one 'recipe'."""
    w = s.workload
    return (s.candidate.method, w.precision, w.checkpointing, w.zero)


def search(p: Preset, card: int, gpus: int = 1, seq: int = 2048, global_batch: int = 16, lora_rank: int = 16,
           methods=METHODS, hw: Hardware = Hardware(), context: int = CONTEXT_BYTES, precisions=PRECISIONS):
    """(all scored candidates, the fitting ones ranked best-first with one per recipe)."""
    usable = card - context
    if usable <= 0:
        raise WorkloadError(f"显存 {fmt_bytes(card)} 小于 CUDA 上下文的预留（{fmt_bytes(context)}）")
    overhead = allocator_overhead()
    scored = []
    for c in candidates(p, seq, global_batch, gpus, lora_rank, methods, precisions):
        try:
            scored.append(score(c, p, usable, hw, overhead))
        except WorkloadError:
            continue
    fitting = sorted((s for s in scored if s.fits), key=_key)
    # keep the Pareto front: a candidate is dropped if another is at least as fast and needs at
    # most as much memory (so each one shown is the fastest way to fit in its amount of memory);
    # an alternative must save at least PARETO_STEP of the memory to count as one
    # First the best of each recipe (its cheapest, largest micro-batch), then the front over those.
    per_recipe, seen = [], set()
    for s in fitting:
        k = _family_key(s)
        if k not in seen:
            seen.add(k)
            per_recipe.append(s)
    # The front is taken per method (full / LoRA / QLoRA trade quality, which the cost model does not
    # see); each method's fastest comes first, then the memory-saving alternatives, by cost.
    fronts = {}
    for s in per_recipe:
        front = fronts.setdefault(s.candidate.method, [])
        if not front or s.need_bytes < front[-1].need_bytes * (1 - PARETO_STEP):
            front.append(s)
    heads = sorted((f[0] for f in fronts.values()), key=_key)
    rest = sorted((s for f in fronts.values() for s in f[1:]), key=_key)
    return scored, heads + rest


# ---------------------------------------------------------------------------------------------
# Verification on the simulated device
# ---------------------------------------------------------------------------------------------

def sim_reason(c: Candidate, p: Preset) -> str | None:
    """Why the simulated device cannot run `c` (None: it can)."""
    w = c.workload
    if w.gpus > 1:
        return "多卡（ZeRO/数据并行）：模拟设备只跑单个进程，此项按估算"
    if c.qlora and p.family == "mixtral":
        return "QLoRA + MoE：专家权重是 3 维张量，模拟设备的 NF4 替身只替换线性层，此项按估算"
    if w.optimizer == "adamw8bit" and c.method == "full":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return "8-bit AdamW 需要 bitsandbytes，本机没有安装，此项按估算"
    if p.family == "mixtral" and w.param_dtype_name != "bf16":
        return ("MoE：transformers 的 grouped_mm 专家实现在 FakeTensorMode 下只接受 BF16 权重，"
                "此项按估算")
    return None


def run_on_sim(w: Workload, budget: int | None, steps: int = 1, qlora: bool = False) -> dict:
    """Warm-up step + `steps` measured steps of `w` on SimDevice(fake=True, budget=budget); with
    `qlora`, the base's linear layers are NF4 stand-ins (vramlab.sim.nf4).

    Accumulation runs at most 2 micro-batches per step: from the second one on, every micro-batch
    sees the same memory (the gradients of the first already exist), so 16 would peak the same."""
    import contextlib

    import torch

    from .meter import measure_steps, open_device
    from .runner import build_training
    from .sim.nf4 import qlora_runner

    t0 = time.perf_counter()
    try:
        with qlora_runner() if qlora else contextlib.nullcontext(), \
                open_device("sim", fake=True, budget=budget, timeline=False) as dev:
            _model, _opt, step = build_training(replace(w, accum=min(w.accum, 2)), dev)
            m = measure_steps(step, dev, warmup=1, steps=steps)
    except torch.OutOfMemoryError as e:
        return {"status": "oom", "message": str(e).split("\n")[0], "seconds": round(time.perf_counter() - t0, 1)}
    return {"status": "fits", "peak_bytes": int(m.peak_bytes), "reserved_bytes": int(m.reserved_peak_bytes),
            "breakdown": {k: int(v) for k, v in m.breakdown.items()}, "seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------

def _toggles(s: Scored) -> list[tuple[str, Candidate]]:
    """Each technique the recommendation uses, and the candidate without it."""
    c, w = s.candidate, s.workload
    out = []
    if c.qlora:
        out.append(("QLoRA（NF4 基座）", replace(c, qlora=False)))
    elif w.lora_rank:
        out.append((f"LoRA r={w.lora_rank}", Candidate(replace(w, lora_rank=0))))
    if w.precision != "fp32":
        out.append((PRECISION_ZH[w.precision], replace(c, workload=replace(w, precision="fp32"))))
    if w.optimizer != "adamw":
        out.append((OPTIMIZER_ZH[w.optimizer], replace(c, workload=replace(w, optimizer="adamw"))))
    if w.checkpointing != "none":
        out.append((CKPT_ZH[w.checkpointing], replace(c, workload=replace(w, checkpointing="none"))))
    if w.offload != "none":
        out.append(("激活值卸载到主存（save_on_cpu）", replace(c, workload=replace(w, offload="none"))))
    if w.zero:
        out.append((f"ZeRO-{w.zero}（{w.gpus} 卡分片）", replace(c, workload=replace(w, zero=0))))
    if w.accum > 1:
        out.append((f"梯度累积 {w.accum} 步", replace(c, workload=replace(w, batch=w.batch * w.accum, accum=1))))
    return out


def _workload_zh(c: Candidate) -> str:
    w = c.workload
    parts = [METHOD_ZH[c.method] + (f" r={w.lora_rank}" if w.lora_rank else ""), PRECISION_ZH[w.precision],
             OPTIMIZER_ZH[w.optimizer], CKPT_ZH[w.checkpointing]]
    if w.offload != "none":
        parts.append("激活值卸载")
    if w.gpus > 1:
        parts.append(f"{w.gpus} 卡" + (f" ZeRO-{w.zero}" if w.zero else " 数据并行"))
    parts.append(f"微批次 {w.batch} × 累积 {w.accum}")
    return "，".join(parts)


def _command(c: Candidate, config: str | None) -> str:
    w = c.workload
    cmd = [f"vramlab estimate --config {config}" if config else f"vramlab estimate --model {w.model}",
           f"--batch {w.batch} --seq {w.seq} --precision {w.precision} --optimizer {w.optimizer}",
           f"--checkpointing {w.checkpointing}"]
    if w.lora_rank:
        cmd.append(f"--lora-rank {w.lora_rank}")
    if w.accum > 1:
        cmd.append(f"--accum {w.accum}")
    if w.offload != "none":
        cmd.append(f"--offload {w.offload}")
    if w.gpus > 1:
        cmd.append(f"--gpus {w.gpus}" + (f" --zero {w.zero}" if w.zero else ""))
    return " ".join(cmd) + ("   # QLoRA：vramlab estimate 没有 --qlora，按 Python 的 estimate(w, qlora=True)" if c.qlora else "")


def make_plan(p: Preset, card: int, gpus: int = 1, seq: int | None = None, global_batch: int = 16,
              lora_rank: int = 16, top: int = 3, verify: bool = True, methods=METHODS, hw: Hardware = Hardware(),
              context: int = CONTEXT_BYTES, config_path: str | None = None, progress=None,
              precisions=PRECISIONS) -> dict:
    """The plan as a JSON-ready dict (see `print_plan` for the human form)."""
    max_pos = p.config.get("n_positions", p.config.get("max_position_embeddings"))
    seq = seq or min(2048, max_pos)
    if seq > max_pos:
        raise WorkloadError(f"模型最多支持 {max_pos} 个位置，--seq {seq} 太长")
    if gpus < 1 or global_batch < 1 or global_batch % gpus:
        raise WorkloadError(f"--global-batch（{global_batch}）必须是 --gpus（{gpus}）的正整数倍")
    if lora_rank < 1:
        raise WorkloadError(f"--lora-rank 必须是正整数，收到 {lora_rank}")
    usable = card - context
    scored, ranked = search(p, card, gpus, seq, global_batch, lora_rank, methods, hw, context, precisions)
    overhead = allocator_overhead()
    recs, rejected = [], []
    for s in ranked:
        if len(recs) >= top:
            break
        rec = _recommendation(s, p, usable, hw, overhead, verify, config_path, progress)
        if rec["verified"]["status"] == "oom":
            rejected.append({"workload": s.workload.to_dict(), "qlora": s.candidate.qlora,
                             "reason": "估算装得下，模拟设备上 OOM：" + rec["verified"]["message"]})
            continue
        rec["rank"] = len(recs) + 1
        recs.append(rec)
    fitting = sum(s.fits for s in scored)
    return {
        "model": {"name": p.name, "family": p.family, "params": param_count(p), "note": p.note,
                  "config": config_path},
        "card_bytes": card, "context_bytes": context, "usable_bytes": usable, "allocator_overhead": round(overhead, 4),
        "gpus": gpus, "seq": seq, "global_batch": global_batch, "lora_rank": lora_rank,
        "hardware": asdict(hw), "searched": len(scored), "fitting": fitting,
        "recommendations": recs, "rejected_by_sim": rejected,
        "notes": _notes(p, scored, gpus),
    }


def _recommendation(s: Scored, p: Preset, usable: int, hw: Hardware, overhead: float, verify: bool,
                    config_path: str | None, progress) -> dict:
    c, w = s.candidate, s.workload
    techniques = []
    for label, without in _toggles(s):
        try:
            t = score(without, p, usable, hw, overhead)
            techniques.append({"technique": label, "without_need_bytes": t.need_bytes, "without_fits": t.fits,
                               "saves_bytes": t.need_bytes - s.need_bytes,
                               "costs_seconds": s.cost["total"] - t.cost["total"]})
        except WorkloadError:
            continue
    per_gpu = w.batch * w.accum
    nxt = None
    if 2 * w.batch <= per_gpu and per_gpu % (2 * w.batch) == 0:
        bigger = replace(c, workload=replace(w, batch=2 * w.batch, accum=per_gpu // (2 * w.batch)))
        t = score(bigger, p, usable, hw, overhead)
        nxt = {"batch": 2 * w.batch, "accum": per_gpu // (2 * w.batch), "need_bytes": t.need_bytes,
               "fits_estimate": t.fits}
    reason = sim_reason(c, p)
    if not verify:
        verified = {"status": "skipped", "reason": "未验证（--no-verify）"}
    elif reason:
        verified = {"status": "skipped", "reason": reason}
    else:
        if progress:
            progress(f"模拟设备验证：{_workload_zh(c)} …")
        verified = run_on_sim(w, usable, qlora=c.qlora)
        if verified["status"] == "fits" and nxt is not None:
            if progress:
                progress(f"模拟设备验证：微批次 {nxt['batch']} …")
            nxt["sim"] = run_on_sim(bigger.workload, usable, qlora=c.qlora)
    head = qlora_head_correction(c, p)
    breakdown = dict(s.estimate.breakdown)
    breakdown["parameters"] += head
    return {"method": c.method, "qlora": c.qlora, "workload": w.to_dict(), "summary": _workload_zh(c),
            "estimate_bytes": s.estimate.total_bytes + head, "need_bytes": s.need_bytes,
            "breakdown": breakdown, "peak_phase": s.estimate.peak_phase,
            "trainable_params": s.estimate.trainable_params,
            "cost": {k: round(v, 6) for k, v in s.cost.items()}, "techniques": techniques,
            "verified": verified, "next_micro_batch": nxt, "command": _command(c, config_path),
            "warnings": _warnings(c)}


def _warnings(c: Candidate) -> list[str]:
    w = c.workload
    out = []
    if c.method == "full" and w.precision == "bf16":
        out.append("纯 BF16 权重做全参数训练：小于权重约 2⁻⁸ 的更新会被舍入掉（第 6 章），"
                   "常见做法是保留 FP32 主权重（混合精度）或用随机舍入 / Kahan 求和。")
    if w.optimizer == "adamw8bit" and c.method == "full":
        out.append("8-bit AdamW 的状态按估算器的 2 + 8/2048 字节/参数计；bitsandbytes 0.50 实际用 256 个一块，"
                   "多约 0.03 字节/参数。")
    return out


def _notes(p: Preset, scored: list[Scored], gpus: int) -> list[str]:
    notes = []
    sel = [s for s in scored if s.workload.checkpointing == "selective"]
    if sel and all(s.workload.attention == "sdpa" for s in sel):
        notes.append("选择性重算：SDPA（FlashAttention / memory-efficient 内核）本来就不保存 s² 的注意力分数，"
                     "估算器认为它几乎省不下显存，却要重算注意力模块，所以很少入选。")
    if gpus > 1:
        notes.append("多卡各项只按估算（模拟设备只跑单个进程）；数据并行（ZeRO-0）另计 DDP 梯度桶（默认再占一份梯度）。")
    if any(s.candidate.qlora for s in scored):
        tied = p.family in ("gpt2", "bert") or p.config.get("tie_word_embeddings")
        extra = p.vocab * p.hidden * 2 * (1 if tied else 2)      # 16-bit -> fp32: +2 bytes per weight
        notes.append("QLoRA：按 bitsandbytes 的 Linear4bit（NF4 + 双重量化）计，输出层保持 16 位；没有算 "
                     "peft 的 prepare_model_for_kbit_training，它把未量化的参数（词嵌入、输出层、归一化层）升为 FP32，"
                     f"这个模型要多约 {fmt_bytes(extra)}。")
    notes.append("步时按峰值算力、峰值带宽、计算与传输不重叠来算，只用于排序；真实步时更长。")
    return notes


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

def _s(x: float) -> str:
    return f"{x * 1000:,.0f} ms" if x < 10 else f"{x:,.1f} s"


def print_plan(plan: dict, out=sys.stdout) -> None:
    m = plan["model"]
    pr = lambda *a: print(*a, file=out)  # noqa: E731
    pr(f"模型 {m['name']}（{m['family']}，{m['params']:,} 个参数）{'：' + m['note'] if m['note'] else ''}")
    pr(f"显卡 {fmt_bytes(plan['card_bytes'])} × {plan['gpus']}，扣除 CUDA 上下文 {fmt_bytes(plan['context_bytes'])} 后可用 "
       f"{fmt_bytes(plan['usable_bytes'])}；估算的已分配峰值再乘以缓存分配器的典型开销 ×{plan['allocator_overhead']:.3f}"
       f"（H200 参考表 已保留/已分配 的中位数）")
    pr(f"序列 {plan['seq']}，全局批 {plan['global_batch']}；搜索了 {plan['searched']:,} 种组合，估算装得下的 {plan['fitting']:,} 种。")
    hw = plan["hardware"]
    pr(f"步时模型的硬件常数：{hw['name']}：BF16 {hw['bf16_tflops']} TFLOPS、FP32 {hw['fp32_tflops']} TFLOPS、"
       f"显存带宽 {hw['hbm_gbps']:.0f} GB/s、PCIe {hw['pcie_gbps']} GB/s、卡间 {hw['link_gbps']} GB/s")
    if not plan["recommendations"]:
        pr("\n没有装得下的组合：试试更短的 --seq、更小的 --global-batch，或更多 --gpus。")
    for r in plan["recommendations"]:
        c = r["cost"]
        pr(f"\n#{r['rank']}  {r['summary']}")
        pr(f"    估算峰值 {fmt_bytes(r['estimate_bytes'])}（已分配，{r['peak_phase']}）；按分配器开销计约需 {fmt_bytes(r['need_bytes'])}")
        pr("    构成：" + "，".join(f"{CATEGORY_ZH.get(k, k)} {fmt_bytes(v)}" for k, v in r["breakdown"].items() if v))
        parts = [("计算", "compute"), ("重算", "recompute"), ("卸载", "offload"), ("反量化", "dequant"),
                 ("优化器", "optimizer"), ("通信", "communication")]
        pr(f"    估计步时 {_s(c['total'])}（" + "，".join(f"{zh} {_s(c[k])}" for zh, k in parts if c[k] >= 5e-4) + "）")
        for t in r["techniques"]:
            verdict = "装不下" if not t["without_fits"] else "也装得下"
            cost = f"多花 {_s(t['costs_seconds'])}/步" if t["costs_seconds"] > 1e-9 else (
                f"省 {_s(-t['costs_seconds'])}/步" if t["costs_seconds"] < -1e-9 else "不影响步时")
            pr(f"    · {t['technique']}：省下 {fmt_bytes(t['saves_bytes'])}（不用它需 {fmt_bytes(t['without_need_bytes'])}，"
               f"{verdict}），{cost}")
        v = r["verified"]
        if v["status"] == "fits":
            pr(f"    模拟设备（FakeTensorMode，预算 {fmt_bytes(plan['usable_bytes'])}）：已分配峰值 {fmt_bytes(v['peak_bytes'])}，"
               f"已保留峰值 {fmt_bytes(v['reserved_bytes'])}，装得下；估算/模拟 = {r['estimate_bytes'] / v['peak_bytes']:.3f}")
        else:
            pr(f"    模拟设备：{v['reason']}")
        n = r["next_micro_batch"]
        if n is None:
            pr("    微批次已是每卡批大小的上限（不需要梯度累积），没有更大的一档。")
        else:
            sim = n.get("sim")
            tail = ""
            if sim:
                tail = ("；模拟设备上也 OOM" if sim["status"] == "oom" else
                        f"；但模拟设备上装得下（已保留 {fmt_bytes(sim['reserved_bytes'])}：估算偏保守）")
            pr(f"    下一档微批次 {n['batch']}：估计需 {fmt_bytes(n['need_bytes'])}，"
               f"{'装得下' if n['fits_estimate'] else '装不下'}{tail}")
        for warning in r["warnings"]:
            pr(f"    注意：{warning}")
        pr(f"    复现：{r['command']}")
    for rj in plan["rejected_by_sim"]:
        pr(f"\n（跳过）{rj['reason']}")
    pr("")
    for note in plan["notes"]:
        pr(f"注：{note}")


# ---------------------------------------------------------------------------------------------
# Benchmark: estimate vs simulated device for every sample config
# ---------------------------------------------------------------------------------------------

def bench_workloads(p: Preset) -> list[tuple[str, Workload]]:
    """Two workloads per config, micro-batch 1 at min(2048, max positions) tokens:
    LoRA r=16 on a pure BF16 base without checkpointing (activations and logits dominate), and a
    full fine-tune with BF16 mixed precision, AdamW and full checkpointing (model states dominate).
    An MoE's full fine-tune runs in pure BF16: the simulated device's grouped_mm experts need it."""
    max_pos = p.config.get("n_positions", p.config.get("max_position_embeddings"))
    seq = min(2048, max_pos)
    full = "bf16" if p.family == "mixtral" else "bf16-mixed"
    return [("LoRA r=16，BF16 基座，不检查点", Workload(model=p.name, batch=1, seq=seq, precision="bf16", lora_rank=16)),
            (f"全参数，{'BF16' if full == 'bf16' else 'BF16 混合精度'} + AdamW，全量检查点",
             Workload(model=p.name, batch=1, seq=seq, precision=full, checkpointing="full"))]


def _pad(text: str, width: int) -> str:
    """Left-align `text` in `width` terminal columns (CJK characters take two)."""
    import unicodedata

    cols = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return text + " " * max(0, width - cols)


def bench(paths=None, out=sys.stdout, as_json: bool = False) -> list[dict]:
    import torch

    from .hfconfig import load_config, sample_configs

    rows = []
    if not as_json:
        print(f"估算 vs 模拟设备（FakeTensorMode，torch {torch.__version__}）：已分配峰值", file=out)
        print(f"{_pad('配置', 20)} {_pad('工作负载', 40)} {'估算 MiB':>10s} {'模拟 MiB':>10s} {'比值':>7s} {'耗时':>6s}",
              file=out)
    for path in paths or sample_configs():
        p = load_config(path)
        for label, w in bench_workloads(p):
            est = estimate(w).total_bytes
            sim = run_on_sim(w, None)
            ratio = est / sim["peak_bytes"]
            row = {"config": str(path), "model": p.name, "workload": label, "estimate_bytes": est,
                   "sim_bytes": sim["peak_bytes"], "ratio": ratio, "seconds": sim["seconds"], "spec": w.to_dict()}
            rows.append(row)
            if not as_json:
                print(f"{_pad(p.name[4:], 20)} {_pad(label, 40)} {est / MiB:10,.0f} {sim['peak_bytes'] / MiB:10,.0f} "
                      f"{ratio:7.4f} {sim['seconds']:5.0f}s", file=out, flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    if as_json:
        print(json.dumps({"rows": rows, "worst_abs_error": worst, "torch": torch.__version__}, ensure_ascii=False), file=out)
    else:
        print(f"最大偏差 {100 * worst:.2f}%", file=out)
    return rows


# ---------------------------------------------------------------------------------------------
# Command line (also reached through `vramlab plan`)
# ---------------------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("--config", default=None, metavar="PATH", help="本地 Hugging Face config.json（或存放它的文件夹）")
    p.add_argument("--model", default=None, help="或者：vramlab 的模型预设名")
    p.add_argument("--card", default=None, help="每张卡的显存，例如 24GiB、80GB")
    p.add_argument("--gpus", type=int, default=1, help="卡数（默认 1）")
    p.add_argument("--seq", type=int, default=None, help="序列长度（默认 min(2048, 模型最大位置数)）")
    p.add_argument("--global-batch", type=int, default=16, help="每个优化器步的序列数（默认 16）")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA / QLoRA 的秩（默认 16）")
    p.add_argument("--method", choices=("any",) + METHODS, default="any", help="只看某种方法（默认都看）")
    p.add_argument("--top", type=int, default=3, help="给出几个方案（默认 3）")
    p.add_argument("--no-verify", action="store_true", help="不在模拟设备上验证（快，但只有估算）")
    p.add_argument("--tflops", type=float, default=None, help="BF16 峰值算力 TFLOPS（默认 165.2，RTX 4090；FP32 按它的一半计）")
    p.add_argument("--link-gbps", type=float, default=None, help="卡间带宽 GB/s（默认 31.5，PCIe 4.0 x16）")
    p.add_argument("--bench", action="store_true", help="对每个示例配置比较估算与模拟设备（不需要 --config/--card）")
    p.add_argument("--json", action="store_true", help="输出一个 JSON 对象")


def run(args) -> int:
    """Run `vramlab plan` for parsed `args`; errors are WorkloadError (Chinese)."""
    if args.bench:
        bench(as_json=args.json)
        return 0
    if not args.card:
        raise WorkloadError("需要 --card，例如 --card 24GiB")
    card = parse_bytes(args.card)
    if args.config:
        from .hfconfig import load_config
        preset = load_config(args.config)
    elif args.model:
        preset = get_preset(args.model)
    else:
        raise WorkloadError("需要 --config PATH（本地 config.json）或 --model 预设名")
    for name in ("gpus", "global_batch", "top"):
        if getattr(args, name) < 1:
            raise WorkloadError(f"--{name.replace('_', '-')} 必须是正整数，收到 {getattr(args, name)}")
    if args.seq is not None and args.seq < 1:
        raise WorkloadError(f"--seq 必须是正整数，收到 {args.seq}")
    hw = Hardware()
    if args.tflops:
        hw = replace(hw, name=f"自定义（BF16 {args.tflops} TFLOPS）", bf16_tflops=args.tflops,
                     fp32_tflops=args.tflops / 2)
    if args.link_gbps:
        hw = replace(hw, link_gbps=args.link_gbps)
    methods = METHODS if args.method == "any" else (args.method,)
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    plan = make_plan(preset, card, gpus=args.gpus, seq=args.seq, global_batch=args.global_batch,
                     lora_rank=args.lora_rank, top=args.top, verify=not args.no_verify, methods=methods, hw=hw,
                     config_path=args.config, progress=progress)
    if args.json:
        print(json.dumps(plan, ensure_ascii=False))
    else:
        print_plan(plan)
    return 0


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vramlab.plan", description="在给定显卡上规划一次微调")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (WorkloadError, ValueError, KeyError) as e:
        print(f"错误：{e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
