"""Plan a fine-tune: which settings fit a card, and which of those is fastest?

    vramlab plan --config path/to/config.json --card T4 [--gpus N] [--seq S] [--global-batch B]
                 [--lora-targets default|qkvo|all-linear] [--json]
    vramlab plan --config ... --card 24GiB       # any size; the step-time constants are then an RTX 4090's
    python -m vramlab.plan --bench               # estimate vs simulated device for every sample config
    python -m vramlab.plan --bench --sweep       # every sample config x 16/24/48/80 GiB: picks checked

The search. Every combination of the course's techniques is a `Workload`: precision (mixed and pure
16-bit, FP32: BF16 on cards that have it, FP16 with loss scaling on cards without), method (full
fine-tuning, LoRA and QLoRA with `--lora-rank` on `--lora-targets`), optimizer (AdamW; 8-bit AdamW
where it saves a meaningful share, `EIGHT_BIT_MIN_SHARE`; Adafactor for full fine-tuning),
activation checkpointing (none, selective, full), activation offload (save_on_cpu), ZeRO stage 0-3
over `--gpus` (stage 3 = FSDP's full sharding), and micro-batch x accumulation = global batch /
GPUs (micro-batches are powers of two). `vramlab.estimate` gives each one's peak; a candidate fits
if that peak times the allocator's typical overhead (the median reserved/allocated ratio of the
H200 reference table) is at most the card minus the CUDA context. Candidates that differ only in
micro-batch are one *recipe*; recipes are ranked by `step_cost` of their largest fitting
micro-batch (below). The best recipes are then run on the simulated device under FakeTensorMode
with the card's budget (single GPU only: the simulated device runs one process): a recipe whose
micro-batch does not fit there backs off to the next smaller micro-batch, then gives way to the
next recipe, and each micro-batch one size up is run too: where it fits there after all (the
estimate times the overhead errs on the safe side) the plan takes it, with a note; otherwise the
result shows that it would not fit. What was skipped, and why, is part of the result (8-bit AdamW
below the threshold, recipes off the per-method Pareto front, micro-batches that ran out of
memory on the simulated device, MoE QLoRA).

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

Hardware constants (`Hardware`) come from the card (`CARDS`: peak dense 16-bit tensor TFLOPS with
FP32 accumulate, FP32 TFLOPS, memory bandwidth, PCIe generation, each with its source); for a size
given in bytes, an RTX 4090-class 24 GB card (NVIDIA "Ada GPU Architecture" whitepaper, Appendix
A). PyTorch runs FP32 matmuls without TF32 by default, so FP32 uses the non-tensor rate. The
GPU-to-GPU link is taken as PCIe (no NVLink) unless --link-gbps says otherwise.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

from .estimate import (PHASE_ZH, Estimate, activation_bytes, estimate, linear_shapes, lora_params, matmul_weight_params,
                       param_count, KEYS)
from . import vocab
from .display import pad
from .models import Preset, get_preset
from .units import GiB, MiB, fmt_bytes, parse_bytes
from .workload import LORA_TARGETS, Workload, WorkloadError

CONTEXT_BYTES = 700 * MiB      # CUDA context, outside the allocator: ~600-700 MiB on the H200 reference
PRECISIONS = ("bf16-mixed", "bf16", "fp32")                 # cards with BF16
PRECISIONS_NO_BF16 = ("fp16-mixed", "fp16", "fp32")         # cards without: FP16 with loss scaling
METHODS = ("full", "lora", "qlora")
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)     # estimate.qlora_weight_bytes per weight
PARETO_STEP = 0.02
# 8-bit AdamW is offered only where it saves at least this share of the AdamW candidate's peak.
# It brings a dependency (bitsandbytes, CUDA-only kernels) and quantisation noise in m and v
# (Dettmers et al. 2022 report parity on their benchmarks, not on every model); below 5% of the
# peak a micro-batch size or a checkpointing choice moves memory more than it does. LoRA's
# adapters are ~0.1-1% of the weights, so 8-bit AdamW saves megabytes there and is never offered.
EIGHT_BIT_MIN_SHARE = 0.05
CATEGORY_ZH = vocab.labels(KEYS)      # the estimator's breakdown

METHOD_ZH = {"full": "全参数微调", "lora": "LoRA", "qlora": "QLoRA"}
PRECISION_ZH = {"fp32": "FP32", "bf16-mixed": "BF16 混合精度（FP32 权重 + autocast）", "bf16": "纯 BF16 权重",
                "fp16-mixed": "FP16 混合精度（FP32 权重 + autocast + 损失缩放）", "fp16": "纯 FP16 权重（冻结的基座）"}
OPTIMIZER_ZH = {"adamw": "AdamW", "adamw8bit": "8-bit AdamW", "adafactor": "Adafactor（分解的二阶矩）"}
CKPT_ZH = {"none": "不检查点", "selective": "选择性重算（注意力模块）", "full": "全量激活检查点"}
TARGETS_ZH = {"default": "peft 默认目标", "qkvo": "注意力的 q/k/v/o 投影", "all-linear": "全部线性层（输出层除外）"}
DEFAULT_TARGET_NAMES = {"gpt2": "c_attn", "bert": "query、value", "llama": "q_proj、v_proj", "mixtral": "q_proj、v_proj"}


@dataclass(frozen=True)
class Hardware:
    name: str = "RTX 4090 级 24 GB 显卡（默认常数）"
    bf16_tflops: float = 165.2     # dense 16-bit tensor (BF16, or FP16 on cards without BF16), FP32 accumulate
    fp32_tflops: float = 82.6
    hbm_gbps: float = 1008.0
    pcie_gbps: float = 31.5        # host <-> device, per direction
    link_gbps: float = 31.5        # GPU <-> GPU (PCIe without NVLink)


# PCIe x16 per direction: gen3 8 GT/s, gen4 16, gen5 32 GT/s; 16 lanes, 128b/130b encoding
_PCIE = {3: 15.75, 4: 31.5, 5: 63.0}


@dataclass(frozen=True)
class Card:
    """A GPU: memory (nominal, as the data sheet gives it, taken as GiB: the chips are binary-sized;
    the driver reports a little less, e.g. 40,441 MiB on an A100 40GB), BF16 support, dense 16-bit
    tensor TFLOPS with FP32 accumulate (BF16 where supported, else FP16), FP32 TFLOPS (no TF32),
    memory bandwidth GB/s, PCIe generation, and where the figures come from."""
    name: str
    label: str
    memory_gib: int
    bf16: bool
    tflops16: float
    tflops32: float
    hbm_gbps: float
    pcie: int
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_gib * GiB

    def hardware(self) -> Hardware:
        return Hardware(name=self.label, bf16_tflops=self.tflops16, fp32_tflops=self.tflops32, hbm_gbps=self.hbm_gbps,
                        pcie_gbps=_PCIE[self.pcie], link_gbps=_PCIE[self.pcie])


CARDS = {c.name: c for c in [
    Card("T4", "NVIDIA T4 16 GB", 16, False, 65.0, 8.1, 320, 3,
         "NVIDIA T4 Tensor Core GPU 数据手册：FP16 混合精度 65 TFLOPS、FP32 8.1 TFLOPS、GDDR6 320 GB/s；Turing 没有 BF16"),
    Card("V100-16GB", "NVIDIA V100 SXM2 16 GB", 16, False, 125.0, 15.7, 900, 3,
         "NVIDIA Tesla V100 数据手册（SXM2）：Tensor 125 TFLOPS、FP32 15.7 TFLOPS、HBM2 900 GB/s；Volta 没有 BF16"),
    Card("V100-32GB", "NVIDIA V100 SXM2 32 GB", 32, False, 125.0, 15.7, 900, 3,
         "NVIDIA Tesla V100 数据手册（SXM2）：Tensor 125 TFLOPS、FP32 15.7 TFLOPS、HBM2 900 GB/s；Volta 没有 BF16"),
    Card("A10", "NVIDIA A10 24 GB", 24, True, 125.0, 31.2, 600, 4,
         "NVIDIA A10 数据手册：BF16 Tensor 125 TFLOPS（稀疏 250）、FP32 31.2 TFLOPS、GDDR6 600 GB/s"),
    Card("RTX3090", "GeForce RTX 3090 24 GB", 24, True, 71.0, 35.6, 936, 4,
         "NVIDIA Ampere GA102 白皮书附录 A：BF16 Tensor（FP32 累加）71 TFLOPS、FP32 35.6 TFLOPS、936 GB/s"),
    Card("RTX4090", "GeForce RTX 4090 24 GB", 24, True, 165.2, 82.6, 1008, 4,
         "NVIDIA Ada GPU 架构白皮书附录 A：BF16 Tensor（FP32 累加）165.2 TFLOPS、FP32 82.6 TFLOPS、1008 GB/s"),
    Card("L4", "NVIDIA L4 24 GB", 24, True, 121.0, 30.3, 300, 4,
         "NVIDIA L4 数据手册：BF16 Tensor 121 TFLOPS（稀疏 242）、FP32 30.3 TFLOPS、GDDR6 300 GB/s"),
    Card("A100-40GB", "NVIDIA A100 SXM 40 GB", 40, True, 312.0, 19.5, 1555, 4,
         "NVIDIA A100 数据手册：BF16 Tensor 312 TFLOPS、FP32 19.5 TFLOPS、HBM2 1555 GB/s"),
    Card("A100-80GB", "NVIDIA A100 SXM 80 GB", 80, True, 312.0, 19.5, 2039, 4,
         "NVIDIA A100 数据手册：BF16 Tensor 312 TFLOPS、FP32 19.5 TFLOPS、HBM2e 2039 GB/s"),
    Card("H100", "NVIDIA H100 SXM 80 GB", 80, True, 989.4, 66.9, 3350, 5,
         "NVIDIA H100 数据手册（SXM）：BF16 Tensor 989 TFLOPS（稀疏 1979）、FP32 67 TFLOPS、HBM3 3.35 TB/s"),
    Card("H200", "NVIDIA H200 SXM 141 GB", 140, True, 989.4, 66.9, 4800, 5,
         "NVIDIA H200 数据手册（SXM）：BF16 Tensor 989 TFLOPS（稀疏 1979）、FP32 67 TFLOPS、HBM3e 4.8 TB/s；"
         "标称 141 GB，本项目 H200 参考表实测总量 143,771 MiB（约 140.4 GiB），按 140 GiB 计"),
]}
_CARD_ALIASES = {"V100": "V100-16GB", "A100": "A100-40GB", "3090": "RTX3090", "4090": "RTX4090",
                 "H100-80GB": "H100", "H200-141GB": "H200"}


def find_card(text: str) -> Card | None:
    """A card of `CARDS` by name, forgiving case, spaces and dashes ("t4", "A100 80GB", "rtx 4090")."""
    def key(s):
        return re.sub(r"[\s_\-]+", "", s).upper()
    names = {key(n): n for n in CARDS} | {key(a): n for a, n in _CARD_ALIASES.items()}
    name = names.get(key(text))
    return CARDS[name] if name else None


@dataclass(frozen=True)
class Candidate:
    workload: Workload

    @property
    def qlora(self) -> bool:
        return self.workload.qlora

    @property
    def method(self) -> str:
        return "qlora" if self.workload.qlora else ("lora" if self.workload.lora_rank else "full")


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
    adapters = lora_params(p, w.lora_rank, w.lora_targets) if lora else 0
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
                      if w.qlora else 0.0)

    trainable = adapters if lora else param_count(p)
    wb = 2 if w.precision in ("bf16", "fp16") and not lora else 4        # adapters are fp32 (peft)
    state = {"adamw": 2 * wb, "adamw8bit": 2, "adafactor": 0, "sgd": 0, "sgdm": wb}[w.optimizer]
    if w.zero and w.mixed and not lora:
        state += 4                                            # fp32 master weights
    shard = w.gpus if w.zero else 1
    out["optimizer"] = trainable * (3 * wb + 2 * state) / shard / (hw.hbm_gbps * 1e9)

    comm = 0.0
    if w.gpus > 1:
        ring = (w.gpus - 1) / w.gpus
        gb = 2 if (w.mixed or w.precision in ("bf16", "fp16")) and not lora else 4
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


# ---------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------

def micro_batches(per_gpu: int) -> list[int]:
    return [b for b in (2 ** i for i in range(0, 12)) if b <= per_gpu and per_gpu % b == 0]


def precisions_for(bf16: bool, method: str) -> tuple[str, ...]:
    """Mixed and pure 16-bit and FP32, in BF16 where the card has it, else FP16 (mixed: with a
    GradScaler). Pure FP16 weights only for a frozen base: full fine-tuning in pure FP16 overflows
    and underflows without master weights; QLoRA computes in the 16-bit type (mixed or not)."""
    if method == "qlora":
        return ("bf16-mixed", "bf16") if bf16 else ("fp16-mixed", "fp16")
    if bf16:
        return PRECISIONS
    return ("fp16-mixed", "fp32") if method == "full" else PRECISIONS_NO_BF16


MOE_QLORA_REASON = ("专家权重是 3 维参数而不是 nn.Linear：bitsandbytes 不会把它们量化成 4 位，"
                    "prepare_model_for_kbit_training 还会把它们升为 FP32，所以 vramlab 不估算也不推荐 MoE 的 QLoRA")


def candidates(p: Preset, seq: int, global_batch: int, gpus: int, lora_rank: int = 16, methods=METHODS,
               precisions=None, bf16: bool = True, lora_targets: str = "default") -> list[Candidate]:
    """Every workload of the search, 8-bit AdamW included (see `search` for its threshold)."""
    per_gpu = global_batch // gpus
    out = []
    zeros = (0,) if gpus == 1 else (0, 1, 2, 3)
    for method in methods:
        if method == "qlora" and p.family == "mixtral":
            continue
        precs = precisions_for(bf16, method)
        if precisions is not None:
            precs = tuple(x for x in precs if x in precisions)
        optimizers = ("adamw", "adamw8bit", "adafactor") if method == "full" else ("adamw", "adamw8bit")
        for precision in precs:
            for optimizer in optimizers:
                for ckpt in ("none", "selective", "full"):
                    for offload in ("none", "activations"):
                        for zero in zeros:
                            for b in micro_batches(per_gpu):
                                w = Workload(model=p.name, batch=b, seq=seq, optimizer=optimizer, precision=precision,
                                             checkpointing=ckpt, lora_rank=0 if method == "full" else lora_rank,
                                             lora_targets=lora_targets if method != "full" else "default",
                                             qlora=method == "qlora", zero=zero, gpus=gpus, accum=per_gpu // b,
                                             offload=offload)
                                out.append(Candidate(w))
    return out


def score(c: Candidate, p: Preset, usable: int, hw: Hardware, overhead: float) -> Scored:
    e = estimate(c.workload)
    need = e.total_bytes
    w = c.workload
    if w.gpus > 1 and w.zero == 0:
        # DDP's gradient buckets are a second copy of the gradients (gradient_as_bucket_view=False,
        # PyTorch's default; see torch.nn.parallel.DistributedDataParallel)
        need += e.trainable_params * (4 if w.lora_rank else (2 if w.precision in ("bf16", "fp16") else 4))
    need = int(need * overhead)
    return Scored(c, e, need, step_cost(c, p, hw), need <= usable)


# prefer, at equal cost: larger micro-batches (fewer, larger kernels), mixed precision over pure
# 16-bit weights (rounding of small updates), AdamW over approximations, less memory
_PREC_RANK = {"bf16-mixed": 0, "fp16-mixed": 0, "fp32": 1, "bf16": 2, "fp16": 2}
_OPT_RANK = {"adamw": 0, "adamw8bit": 1, "adafactor": 2}


def _key(s: Scored):
    w = s.workload
    return (round(s.cost["total"], 6), -w.batch, _PREC_RANK[w.precision], _OPT_RANK[w.optimizer], s.need_bytes)


def _recipe(w: Workload) -> tuple:
    """Candidates that differ only in micro-batch (and accumulation) are one recipe."""
    return (w.qlora, w.lora_rank > 0, w.precision, w.optimizer, w.checkpointing, w.offload, w.zero)


def search(p: Preset, card: int, gpus: int = 1, seq: int = 2048, global_batch: int = 16, lora_rank: int = 16,
           methods=METHODS, hw: Hardware = Hardware(), context: int = CONTEXT_BYTES, precisions=None,
           bf16: bool = True, lora_targets: str = "default"):
    """(all scored candidates, the recipes ranked best-first, what was left out and why).

    A recipe is a list of its fitting candidates, largest micro-batch first. The ranking keeps,
    per method, the Pareto front of the recipes' largest micro-batches: a recipe is dropped if a
    faster one of the same method needs at most 2% more memory (PARETO_STEP). 8-bit AdamW is
    dropped where it saves less than EIGHT_BIT_MIN_SHARE of the AdamW recipe's peak."""
    usable = card - context
    if usable <= 0:
        raise WorkloadError(f"显存 {fmt_bytes(card)} 小于 CUDA 上下文的预留（{fmt_bytes(context)}）")
    overhead = allocator_overhead()
    scored, left_out = [], []
    if "qlora" in methods and p.family == "mixtral":
        left_out.append({"workload": None, "summary": "QLoRA（MoE 模型）", "reason": MOE_QLORA_REASON})
    for c in candidates(p, seq, global_batch, gpus, lora_rank, methods, precisions, bf16, lora_targets):
        try:
            scored.append(score(c, p, usable, hw, overhead))
        except WorkloadError:
            continue
    # 8-bit AdamW: only where it saves a meaningful share of the same recipe with AdamW
    by_key = {(_recipe(s.workload), s.workload.batch): s for s in scored}
    kept, dropped = [], {}
    for s in scored:
        w = s.workload
        base = by_key.get((_recipe(replace(w, optimizer="adamw")), w.batch)) if w.optimizer == "adamw8bit" else None
        if base is not None and base.estimate.total_bytes - s.estimate.total_bytes < \
                EIGHT_BIT_MIN_SHARE * base.estimate.total_bytes:
            if s.fits:
                dropped.setdefault(_recipe(w), []).append((s, base))
            continue
        kept.append(s)
    scored = kept
    kept_recipes = {_recipe(s.workload) for s in scored if s.fits}
    per_method: dict = {}
    for key, pairs in dropped.items():
        if key in kept_recipes:         # some micro-batch of this recipe saves enough: no note
            continue
        s, base = max(pairs, key=lambda sb: sb[0].estimate.total_bytes / max(1, sb[1].estimate.total_bytes))
        per_method.setdefault(s.candidate.method, []).append((s, base))
    for method, pairs in per_method.items():
        s, base = max(pairs, key=lambda sb: 1 - sb[0].estimate.total_bytes / sb[1].estimate.total_bytes)
        saved = max(0, base.estimate.total_bytes - s.estimate.total_bytes)
        left_out.append({"workload": s.workload.to_dict(), "summary": f"{METHOD_ZH[method]} + 8-bit AdamW（{len(pairs)} 个方案）",
                         "reason": f"最多只比 AdamW 省 {fmt_bytes(saved)}（峰值的 {100 * saved / base.estimate.total_bytes:.1f}%），"
                                   f"不到 {EIGHT_BIT_MIN_SHARE:.0%}，不值得为它引入 bitsandbytes"})
    recipes: dict = {}
    for s in sorted((s for s in scored if s.fits), key=lambda s: -s.workload.batch):
        recipes.setdefault(_recipe(s.workload), []).append(s)
    ordered = sorted(recipes.values(), key=lambda r: _key(r[0]))
    # The front is taken per method (full / LoRA / QLoRA trade quality, which the cost model does not
    # see); each method's fastest comes first, then the memory-saving alternatives, by cost.
    fronts: dict = {}
    for r in ordered:
        front = fronts.setdefault(r[0].candidate.method, [])
        if not front or r[0].need_bytes < front[-1][0].need_bytes * (1 - PARETO_STEP):
            front.append(r)
        else:
            better = front[-1][0]
            left_out.append({"workload": r[0].workload.to_dict(), "summary": workload_zh(r[0].workload, p),
                             "reason": f"比“{workload_zh(better.workload, p)}”慢（{_s(r[0].cost['total'])} 对 "
                                       f"{_s(better.cost['total'])}/步），显存也没有省下 {PARETO_STEP:.0%} 以上"})
    heads = sorted((f[0] for f in fronts.values()), key=lambda r: _key(r[0]))
    rest = sorted((r for f in fronts.values() for r in f[1:]), key=lambda r: _key(r[0]))
    return scored, heads + rest, left_out


# ---------------------------------------------------------------------------------------------
# Verification on the simulated device
# ---------------------------------------------------------------------------------------------

def sim_reason(c: Candidate, p: Preset) -> str | None:
    """Why the simulated device cannot run `c` (None: it can)."""
    w = c.workload
    if w.gpus > 1:
        return "多卡（ZeRO/数据并行）：模拟设备只跑单个进程，此项按估算"
    if w.optimizer == "adamw8bit":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return "8-bit AdamW 需要 bitsandbytes，本机没有安装，此项按估算"
    if p.family == "mixtral" and w.param_dtype_name != "bf16":
        return ("MoE：transformers 的 grouped_mm 专家实现在 FakeTensorMode 下只接受 BF16 权重，"
                "此项按估算")
    return None


def run_on_sim(w: Workload, budget: int | None, steps: int = 1, qlora: bool = False) -> dict:
    """Warm-up step + `steps` measured steps of `w` on SimDevice(fake=True, budget=budget) (QLoRA:
    `w.qlora`, the NF4 stand-in of vramlab.sim.nf4; `qlora=True` is the same, for older callers).

    Accumulation runs at most 2 micro-batches per step: from the second one on, every micro-batch
    sees the same memory (the gradients of the first already exist), so 16 would peak the same."""
    import torch

    from .meter import measure_steps, open_device
    from .runner import build_training

    if qlora:
        w = replace(w, qlora=True)
    t0 = time.perf_counter()
    try:
        with open_device("sim", fake=True, budget=budget, timeline=False) as dev:
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
    w = s.workload
    out = []
    if w.qlora:
        out.append(("QLoRA（NF4 基座）", Candidate(replace(w, qlora=False))))
    elif w.lora_rank:
        out.append((f"LoRA r={w.lora_rank}", Candidate(replace(w, lora_rank=0, lora_targets="default"))))
    if w.precision != "fp32":
        out.append((precision_zh(w), Candidate(replace(w, precision="fp32"))))
    if w.optimizer != "adamw":
        out.append((OPTIMIZER_ZH[w.optimizer], Candidate(replace(w, optimizer="adamw"))))
    if w.checkpointing != "none":
        out.append((CKPT_ZH[w.checkpointing], Candidate(replace(w, checkpointing="none"))))
    if w.offload != "none":
        out.append(("激活值卸载到主存（save_on_cpu）", Candidate(replace(w, offload="none"))))
    if w.zero:
        out.append((f"ZeRO-{w.zero}（{w.gpus} 卡分片）", Candidate(replace(w, zero=0))))
    if w.accum > 1:
        out.append((f"梯度累积 {w.accum} 步", Candidate(replace(w, batch=w.batch * w.accum, accum=1))))
    return out


def targets_zh(w: Workload, p: Preset | None = None) -> str:
    """LoRA's target modules in words (peft's default named per family)."""
    if w.lora_targets == "default" and p is not None:
        return f"目标 {DEFAULT_TARGET_NAMES[p.family]}（peft 默认）"
    return "目标 " + TARGETS_ZH[w.lora_targets]


def precision_zh(w: Workload) -> str:
    """QLoRA's base is NF4 and every other parameter fp32: its precision is the compute dtype."""
    if not w.qlora:
        return PRECISION_ZH[w.precision]
    t = w.compute_dtype_name.upper()
    if w.mixed:
        return f"{t} 计算 + autocast" + ("（损失缩放）" if t == "FP16" else "")
    return f"{t} 计算（不开 autocast）" if t != "FP32" else "FP32 计算"


def workload_zh(w: Workload, p: Preset | None = None) -> str:
    method = "qlora" if w.qlora else ("lora" if w.lora_rank else "full")
    head = METHOD_ZH[method] + (f" r={w.lora_rank}（{targets_zh(w, p)}）" if w.lora_rank else "")
    parts = [head, precision_zh(w), OPTIMIZER_ZH[w.optimizer], CKPT_ZH[w.checkpointing]]
    if w.offload != "none":
        parts.append("激活值卸载")
    if w.gpus > 1:
        parts.append(f"{w.gpus} 卡" + (f" ZeRO-{w.zero}" if w.zero else " 数据并行"))
    parts.append(f"微批次 {w.batch} × 累积 {w.accum}")
    return "，".join(parts)


def _command(w: Workload, config: str | None) -> str:
    cmd = [f"vramlab estimate --config {config}" if config else f"vramlab estimate --model {w.model}",
           f"--batch {w.batch} --seq {w.seq} --precision {w.precision} --optimizer {w.optimizer}",
           f"--checkpointing {w.checkpointing}"]
    if w.lora_rank:
        cmd.append(f"--lora-rank {w.lora_rank}")
        if w.lora_targets != "default":
            cmd.append(f"--lora-targets {w.lora_targets}")
    if w.qlora:
        cmd.append("--qlora")
    if w.accum > 1:
        cmd.append(f"--accum {w.accum}")
    if w.offload != "none":
        cmd.append(f"--offload {w.offload}")
    if w.gpus > 1:
        cmd.append(f"--gpus {w.gpus}" + (f" --zero {w.zero}" if w.zero else ""))
    return " ".join(cmd)


def make_plan(p: Preset, card: int | Card, gpus: int = 1, seq: int | None = None, global_batch: int = 16,
              lora_rank: int = 16, top: int = 3, verify: bool = True, methods=METHODS, hw: Hardware | None = None,
              context: int = CONTEXT_BYTES, config_path: str | None = None, progress=None,
              precisions=None, lora_targets: str = "default", bf16: bool | None = None) -> dict:
    """The plan as a JSON-ready dict (see `print_plan` for the human form). `card`: bytes, or a
    `Card` of CARDS (its memory, BF16 support and speed)."""
    card_info = card if isinstance(card, Card) else None
    card_bytes = card_info.memory_bytes if card_info else card
    if bf16 is None:
        bf16 = card_info.bf16 if card_info else True
    hw = hw or (card_info.hardware() if card_info else Hardware())
    max_pos = p.config.get("n_positions", p.config.get("max_position_embeddings"))
    seq = seq or min(2048, max_pos)
    if seq > max_pos:
        raise WorkloadError(f"模型最多支持 {max_pos} 个位置，--seq {seq} 太长")
    if gpus < 1 or global_batch < 1 or global_batch % gpus:
        raise WorkloadError(f"--global-batch（{global_batch}）必须是 --gpus（{gpus}）的正整数倍")
    if lora_rank < 1:
        raise WorkloadError(f"--lora-rank 必须是正整数，收到 {lora_rank}")
    if lora_targets not in LORA_TARGETS:
        raise WorkloadError(f"--lora-targets 不支持 {lora_targets!r}；可选：{'、'.join(LORA_TARGETS)}")
    usable = card_bytes - context
    scored, ranked, left_out = search(p, card_bytes, gpus, seq, global_batch, lora_rank, methods, hw, context,
                                      precisions, bf16, lora_targets)
    overhead = allocator_overhead()
    recs, skipped = [], list(left_out)
    for recipe in ranked:
        if len(recs) >= top:
            break
        rec = None
        tried: dict[int, dict] = {}
        for s in recipe:                      # largest micro-batch first, then back off
            rec = _recommendation(s, p, usable, hw, overhead, verify, config_path, progress, tried)
            if rec["verified"]["status"] != "oom":
                break
            skipped.append({"workload": s.workload.to_dict(), "summary": workload_zh(s.workload, p),
                            "reason": "估算装得下，模拟设备上 OOM：" + rec["verified"]["message"]
                                      + ("；改试更小的微批次" if s is not recipe[-1] else "；这个方案没有更小的微批次了")})
            rec = None
        if rec is None:
            continue
        # the estimate (times the allocator's typical overhead) errs on the safe side; where the
        # next micro-batch fits on the simulated device after all, the plan takes it
        while (rec["verified"]["status"] == "fits" and rec["next_micro_batch"]
               and rec["next_micro_batch"].get("sim", {}).get("status") == "fits"):
            n = rec["next_micro_batch"]
            bigger = score(Candidate(replace(Workload.from_dict(rec["workload"]), batch=n["batch"], accum=n["accum"])),
                           p, usable, hw, overhead)
            rec = _recommendation(bigger, p, usable, hw, overhead, verify, config_path, progress, tried)
            rec["note"] = (f"估算（乘以分配器开销）说微批次 {n['batch']} 装不下，模拟设备上装得下，所以取它"
                           if not bigger.fits else None)
        rec["rank"] = len(recs) + 1
        recs.append(rec)
    fitting = sum(s.fits for s in scored)
    notes = _notes(p, scored, gpus, bf16, card_info, lora_targets)
    return {
        "model": {"name": p.name, "family": p.family, "params": param_count(p), "note": p.note,
                  "config": config_path},
        "card": asdict(card_info) if card_info else None,
        "card_bytes": card_bytes, "context_bytes": context, "usable_bytes": usable,
        "allocator_overhead": round(overhead, 4), "bf16": bf16,
        "gpus": gpus, "seq": seq, "global_batch": global_batch, "lora_rank": lora_rank, "lora_targets": lora_targets,
        "hardware": asdict(hw), "searched": len(scored), "fitting": fitting,
        "recommendations": recs, "skipped": skipped, "notes": notes,
    }


def _recommendation(s: Scored, p: Preset, usable: int, hw: Hardware, overhead: float, verify: bool,
                    config_path: str | None, progress, tried: dict) -> dict:
    """`tried`: micro-batch -> simulated result of this recipe so far (shared while backing off)."""
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
    bigger = None
    if 2 * w.batch <= per_gpu and per_gpu % (2 * w.batch) == 0:
        bigger = Candidate(replace(w, batch=2 * w.batch, accum=per_gpu // (2 * w.batch)))
        t = score(bigger, p, usable, hw, overhead)
        nxt = {"batch": 2 * w.batch, "accum": per_gpu // (2 * w.batch), "need_bytes": t.need_bytes,
               "fits_estimate": t.fits}
    reason = sim_reason(c, p)
    if not verify:
        verified = {"status": "skipped", "reason": "未验证（--no-verify）"}
    elif reason:
        verified = {"status": "skipped", "reason": reason}
    else:
        if w.batch in tried:
            verified = tried[w.batch]
        else:
            if progress:
                progress(f"模拟设备验证：{workload_zh(w, p)} …")
            verified = tried[w.batch] = run_on_sim(w, usable)
        if verified["status"] == "fits" and nxt is not None:
            if bigger.workload.batch in tried:
                nxt["sim"] = tried[bigger.workload.batch]
            else:
                if progress:
                    progress(f"模拟设备验证：微批次 {nxt['batch']} …")
                nxt["sim"] = tried[bigger.workload.batch] = run_on_sim(bigger.workload, usable)
    return {"method": c.method, "qlora": w.qlora, "workload": w.to_dict(), "summary": workload_zh(w, p),
            "lora_targets": targets_zh(w, p) if w.lora_rank else None,
            "estimate_bytes": s.estimate.total_bytes, "need_bytes": s.need_bytes,
            "breakdown": dict(s.estimate.breakdown), "peak_phase": s.estimate.peak_phase,
            "trainable_params": s.estimate.trainable_params,
            "cost": {k: round(v, 6) for k, v in s.cost.items()}, "techniques": techniques,
            "verified": verified, "next_micro_batch": nxt, "command": _command(w, config_path),
            "warnings": _warnings(w)}


def _warnings(w: Workload) -> list[str]:
    out = []
    if not w.lora_rank and w.precision in ("bf16", "fp16"):
        out.append("纯 16 位权重做全参数训练：小于权重约 2⁻⁸ 的更新会被舍入掉（第 6 章），"
                   "常见做法是保留 FP32 主权重（混合精度）或用随机舍入 / Kahan 求和。")
    if w.precision.startswith("fp16"):
        out.append("FP16 的指数位只有 5 位：混合精度训练要用损失缩放（torch.amp.GradScaler），"
                   "否则小梯度会下溢为 0（第 6 章）。")
    return out


def _notes(p: Preset, scored: list[Scored], gpus: int, bf16: bool, card: Card | None, targets: str) -> list[str]:
    notes = []
    if card is not None:
        notes.append(f"显卡参数：{card.source}。显存按 {card.memory_gib} GiB 计（驱动报告的可用总量可能略少）。")
    if not bf16:
        notes.append("这张卡没有 BF16：方案改用 FP16 混合精度（FP32 主权重 + autocast + GradScaler 损失缩放）；"
                     "纯 FP16 权重只用于冻结的基座（LoRA / QLoRA）。")
    if any(s.workload.lora_rank for s in scored):
        notes.append(f"LoRA / QLoRA 的目标模块：{TARGETS_ZH[targets]}"
                     + (f"（这个模型是 {DEFAULT_TARGET_NAMES[p.family]}）" if targets == "default" else "")
                     + "；用 --lora-targets qkvo 或 all-linear 换成更多层（适配器更大，激活值也更多）。")
    sel = [s for s in scored if s.workload.checkpointing == "selective"]
    if sel:
        notes.append("选择性重算：vramlab 的定义是每层注意力模块（q/k/v/o 投影与注意力核心）只保留输入、反向时重算"
                     "（第 7 章教程的做法）；与全量检查点相比省得少，但只多算注意力部分。")
    if gpus > 1:
        notes.append("多卡各项只按估算（模拟设备只跑单个进程）；数据并行（ZeRO-0）另计 DDP 梯度桶（默认再占一份梯度）。")
    if any(s.workload.qlora for s in scored):
        notes.append("QLoRA：按 bitsandbytes 的 Linear4bit（NF4 + 双重量化）计，输出层不量化；并按 peft 的 "
                     "prepare_model_for_kbit_training 把其余参数（词嵌入、输出层、归一化层）升为 FP32，"
                     "计算精度（bnb_4bit_compute_dtype）取方案的 16 位类型。")
    notes.append(f"8-bit AdamW 只在比 AdamW 省下峰值的 {EIGHT_BIT_MIN_SHARE:.0%} 以上时才列入：否则多一个依赖"
                 "（bitsandbytes）和量化误差，换来的显存还不如调一档微批次或检查点。")
    notes.append("步时按峰值算力、峰值带宽、计算与传输不重叠来算，只用于排序；真实步时更长。")
    return notes


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------

def _s(x: float) -> str:
    return f"{x * 1000:,.0f} ms" if x < 10 else f"{x:,.1f} s"


def print_plan(plan: dict, out=sys.stdout, skipped_shown: int = 8) -> None:
    m = plan["model"]
    pr = lambda *a: print(*a, file=out)  # noqa: E731
    pr(f"模型 {m['name']}（{m['family']}，{m['params']:,} 个参数）{'：' + m['note'] if m['note'] else ''}")
    card = plan["card"]
    what = f"{card['label']}（{'支持' if card['bf16'] else '不支持'} BF16）" if card else fmt_bytes(plan["card_bytes"])
    pr(f"显卡 {what} × {plan['gpus']}，扣除 CUDA 上下文 {fmt_bytes(plan['context_bytes'])} 后可用 "
       f"{fmt_bytes(plan['usable_bytes'])}；估算的已分配峰值再乘以缓存分配器的典型开销 ×{plan['allocator_overhead']:.3f}"
       f"（H200 参考表 已保留/已分配 的中位数）")
    pr(f"序列 {plan['seq']}，全局批 {plan['global_batch']}；搜索了 {plan['searched']:,} 种组合，估算装得下的 {plan['fitting']:,} 种。")
    hw = plan["hardware"]
    pr(f"步时模型的硬件常数：{hw['name']}：16 位 {hw['bf16_tflops']} TFLOPS、FP32 {hw['fp32_tflops']} TFLOPS、"
       f"显存带宽 {hw['hbm_gbps']:.0f} GB/s、PCIe {hw['pcie_gbps']} GB/s、卡间 {hw['link_gbps']} GB/s")
    if not plan["recommendations"]:
        pr("\n没有装得下的组合：试试更短的 --seq、更小的 --global-batch，或更多 --gpus。")
    for r in plan["recommendations"]:
        c = r["cost"]
        pr(f"\n#{r['rank']}  {r['summary']}")
        pr(f"    估算峰值 {fmt_bytes(r['estimate_bytes'])}（已分配，{PHASE_ZH.get(r['peak_phase'], r['peak_phase'])}）；按分配器开销计约需 {fmt_bytes(r['need_bytes'])}")
        pr("    构成：" + "，".join(f"{CATEGORY_ZH.get(k, k)} {fmt_bytes(v)}" for k, v in r["breakdown"].items() if v))
        parts = [("计算", "compute"), ("重算", "recompute"), ("卸载", "offload"), ("反量化", "dequant"),
                 ("优化器", "optimizer"), ("通信", "communication")]
        pr(f"    估计步时 {_s(c['total'])}（" + "，".join(f"{zh} {_s(c[k])}" for zh, k in parts if c[k] >= 5e-4) + "）")
        for t in r["techniques"]:
            verdict = "装不下" if not t["without_fits"] else "也装得下"
            cost = f"多花 {_s(t['costs_seconds'])}/步" if t["costs_seconds"] > 1e-9 else (
                f"省 {_s(-t['costs_seconds'])}/步" if t["costs_seconds"] < -1e-9 else "不影响步时")
            saves = (f"省下 {fmt_bytes(t['saves_bytes'])}" if t["saves_bytes"] >= 0
                     else f"多用 {fmt_bytes(-t['saves_bytes'])}")
            pr(f"    · {t['technique']}：{saves}（不用它需 {fmt_bytes(t['without_need_bytes'])}，"
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
            if sim and sim["status"] == "oom":
                tail = "；模拟设备上也 OOM" if not n["fits_estimate"] else "，但模拟设备上 OOM，所以退到这一档"
            elif sim:
                tail = f"；模拟设备上装得下（已保留 {fmt_bytes(sim['reserved_bytes'])}）"
            pr(f"    下一档微批次 {n['batch']}：估计需 {fmt_bytes(n['need_bytes'])}，"
               f"{'装得下' if n['fits_estimate'] else '装不下'}{tail}")
        if r.get("note"):
            pr(f"    说明：{r['note']}")
        for warning in r["warnings"]:
            pr(f"    注意：{warning}")
        pr(f"    复现：{r['command']}")
    if plan["skipped"]:
        pr(f"\n跳过的方案（{len(plan['skipped'])} 个，列出前 {min(skipped_shown, len(plan['skipped']))} 个；--json 给出全部）：")
        for sk in plan["skipped"][:skipped_shown]:
            pr(f"  · {sk['summary']}：{sk['reason']}")
    pr("")
    for note in plan["notes"]:
        pr(f"注：{note}")


def cards_table(out=sys.stdout) -> None:
    """`vramlab plan --cards`: the cards `--card` knows."""
    print(f"{'名字':12s} {'显存':>7s} {'BF16':>5s} {'16 位 TFLOPS':>12s} {'FP32':>6s} {'带宽 GB/s':>9s}  来源", file=out)
    for c in CARDS.values():
        print(f"{c.name:12s} {c.memory_gib:5d} GiB {'有' if c.bf16 else '无':>4s} {c.tflops16:12.1f} {c.tflops32:6.1f} "
              f"{c.hbm_gbps:9.0f}  {c.source}", file=out)


# ---------------------------------------------------------------------------------------------
# Benchmarks: estimate vs simulated device for every sample config; the planner's picks
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


def bench(paths=None, out=sys.stdout, as_json: bool = False) -> list[dict]:
    import torch

    from .hfconfig import load_config, sample_configs

    rows = []
    if not as_json:
        print(f"估算 vs 模拟设备（FakeTensorMode，torch {torch.__version__}）：已分配峰值", file=out)
        print(f"{pad('配置', 20)} {pad('工作负载', 40)} {'估算 MiB':>10s} {'模拟 MiB':>10s} {'比值':>7s} {'耗时':>6s}",
              file=out)
    for path in paths or sample_configs():
        p = load_config(path)
        for label, w in bench_workloads(p):
            est = estimate(w, device="sim").total_bytes
            sim = run_on_sim(w, None)
            ratio = est / sim["peak_bytes"]
            row = {"config": str(path), "model": p.name, "workload": label, "estimate_bytes": est,
                   "sim_bytes": sim["peak_bytes"], "ratio": ratio, "seconds": sim["seconds"], "spec": w.to_dict()}
            rows.append(row)
            if not as_json:
                print(f"{pad(p.name[4:], 20)} {pad(label, 40)} {est / MiB:10,.0f} {sim['peak_bytes'] / MiB:10,.0f} "
                      f"{ratio:7.4f} {sim['seconds']:5.0f}s", file=out, flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    if as_json:
        print(json.dumps({"rows": rows, "worst_abs_error": worst, "torch": torch.__version__}, ensure_ascii=False), file=out)
    else:
        print(f"最大偏差 {100 * worst:.2f}%", file=out)
    return rows


SWEEP_CARDS_GIB = (16, 24, 48, 80)


def bench_figures(rows: list[dict]) -> dict:
    """`vramlab plan --bench --record`: the history entry's figures (vramlab.perf)."""
    ratios = [r["ratio"] for r in rows]
    return {"估算/模拟设备 最小": round(min(ratios), 4), "最大": round(max(ratios), 4),
            "示例 config": len({r["config"] for r in rows})}


def sweep_figures(rows: list[dict], cards=SWEEP_CARDS_GIB) -> dict:
    """`vramlab plan --bench --sweep --record`: how many picks, how many verified to fit, the
    next-micro-batch checks, and per sample config one mark per pick on each card (✓ checked and
    right, ✗ wrong, · not verified on the simulated device, — nothing fits)."""
    picks = [r for r in rows if r["pick_status"] != "-"]      # "-": nothing fits that card
    checked_next = [r for r in rows if r["next_batch"] and not r["next_fits_estimate"] and r["next_sim"]]
    figures = {"显卡 GiB": "/".join(str(c) for c in cards), "推荐方案": len(picks),
               "模拟设备上装得下": sum(bool(r["pick_fits"]) for r in picks),
               "未在模拟设备上验证": sum(r["pick_status"] == "skipped" for r in picks),
               "下一档（估算装不下）核对": len(checked_next),
               "其中模拟其实装得下": sum(r["next_sim"] == "fits" for r in checked_next),
               "全部通过": all(r["ok"] for r in rows)}
    for config in dict.fromkeys(r["config"] for r in rows):
        cells = []
        for gib in cards:
            mine = [r for r in rows if r["config"] == config and r["card_gib"] == gib]
            marks = "".join("—" if r["pick_status"] == "-" else ("·" if r["pick_status"] == "skipped" else
                                                                  ("✓" if r["ok"] else "✗")) for r in mine)
            cells.append(f"{gib}:{marks}")
        figures[config] = " ".join(cells)
    return figures


def check_plan(plan: dict) -> list[dict]:
    """One row per recommendation: does the pick fit on the simulated device, and where the plan
    says the next micro-batch up does not fit, does it indeed not?"""
    rows = []
    for r in plan["recommendations"]:
        v, n = r["verified"], r["next_micro_batch"]
        nxt_sim = (n or {}).get("sim")
        row = {"summary": r["summary"], "pick_status": v["status"],
               "pick_fits": v["status"] == "fits" and v["reserved_bytes"] <= plan["usable_bytes"],
               "next_batch": n["batch"] if n else None, "next_fits_estimate": n["fits_estimate"] if n else None,
               "next_sim": nxt_sim["status"] if nxt_sim else None}
        row["ok"] = (v["status"] == "skipped" or row["pick_fits"]) and not (
            n and not n["fits_estimate"] and nxt_sim and nxt_sim["status"] == "fits")
        rows.append(row)
    return rows


def sweep(paths=None, cards=SWEEP_CARDS_GIB, top: int = 3, out=sys.stdout, as_json: bool = False,
          progress=None) -> list[dict]:
    """Every sample config x every card size: the planner's picks checked on the simulated device."""
    from .hfconfig import load_config, sample_configs

    table = []
    for path in paths or sample_configs():
        p = load_config(path)
        for gib in cards:
            t0 = time.perf_counter()
            plan = make_plan(p, gib * GiB, top=top, progress=progress)
            for row in check_plan(plan) or [{"summary": "（没有装得下的组合）", "pick_status": "-", "pick_fits": None,
                                            "next_batch": None, "next_fits_estimate": None, "next_sim": None,
                                            "ok": True}]:
                row.update(config=path.stem, card_gib=gib, seconds=round(time.perf_counter() - t0, 1))
                table.append(row)
                if not as_json:
                    nxt = "-" if row["next_batch"] is None else (
                        f"{row['next_batch']}：估算{'装得下' if row['next_fits_estimate'] else '装不下'}，"
                        f"模拟{'装得下' if row['next_sim'] == 'fits' else ('OOM' if row['next_sim'] == 'oom' else '未跑')}")
                    pick = {True: "装得下", False: "装不下", None: "-"}[row["pick_fits"]]
                    print(f"{'✓' if row['ok'] else '✗'} {path.stem:20s} {gib:3d} GiB  {pick:4s}  下一档 {nxt}  "
                          f"{row['summary']}", file=out, flush=True)
    if as_json:
        print(json.dumps({"rows": table, "ok": all(r["ok"] for r in table)}, ensure_ascii=False), file=out)
    return table


# ---------------------------------------------------------------------------------------------
# Command line (also reached through `vramlab plan`)
# ---------------------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument("--config", default=None, metavar="PATH", help="本地 Hugging Face config.json（或存放它的文件夹）")
    p.add_argument("--model", default=None, help="或者：vramlab 的模型预设名")
    p.add_argument("--card", default=None,
                   help="显卡：型号（" + "、".join(CARDS) + "；--cards 列出参数与来源），或每张卡的显存，例如 24GiB、80GB")
    p.add_argument("--gpus", type=int, default=1, help="卡数（默认 1）")
    p.add_argument("--seq", type=int, default=None, help="序列长度（默认 min(2048, 模型最大位置数)）")
    p.add_argument("--global-batch", type=int, default=16, help="每个优化器步的序列数（默认 16）")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA / QLoRA 的秩（默认 16）")
    p.add_argument("--lora-targets", choices=LORA_TARGETS, default="default",
                   help="LoRA / QLoRA 的目标模块：default（peft 默认，Llama 式为 q_proj、v_proj）、qkvo、all-linear")
    p.add_argument("--method", choices=("any",) + METHODS, default="any", help="只看某种方法（默认都看）")
    p.add_argument("--top", type=int, default=3, help="给出几个方案（默认 3）")
    p.add_argument("--no-verify", action="store_true", help="不在模拟设备上验证（快，但只有估算）")
    p.add_argument("--tflops", type=float, default=None, help="16 位峰值算力 TFLOPS（默认取 --card 的；FP32 按它的一半计）")
    p.add_argument("--link-gbps", type=float, default=None, help="卡间带宽 GB/s（默认按 PCIe）")
    p.add_argument("--cards", action="store_true", help="列出 --card 认识的显卡（显存、BF16、算力、带宽、来源）")
    p.add_argument("--bench", action="store_true", help="对每个示例配置比较估算与模拟设备（不需要 --config/--card）")
    p.add_argument("--sweep", action="store_true",
                   help="与 --bench 同用：每个示例配置 × 16/24/48/80 GiB，在模拟设备上核对每个推荐方案和下一档微批次（很慢）")
    p.add_argument("--json", action="store_true", help="输出一个 JSON 对象")
    p.add_argument("--record", action="store_true",
                   help="与 --bench（或 --bench --sweep）同用：把结果追加到 vramlab/data/perf/history.jsonl")


def run(args) -> int:
    """Run `vramlab plan` for parsed `args`; errors are WorkloadError (Chinese)."""
    if args.cards:
        cards_table()
        return 0
    if getattr(args, "record", False) and not args.bench:
        raise WorkloadError("--record 只能与 --bench（或 --bench --sweep）同用：它记录的是基准的结果")
    if args.bench:
        from .perf import record

        t0 = time.perf_counter()
        if args.sweep:
            progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
            rows = sweep(as_json=args.json, progress=progress)
            if getattr(args, "record", False):
                record("plan-sweep", "vramlab plan --bench --sweep --record", sweep_figures(rows),
                       note=f"耗时 {(time.perf_counter() - t0) / 60:.0f} 分钟；每个示例 config 在每种显存上取前 3 个方案")
            return 0 if all(r["ok"] for r in rows) else 1
        rows = bench(as_json=args.json)
        if getattr(args, "record", False):
            record("plan-bench", "vramlab plan --bench --record", bench_figures(rows),
                   note=f"耗时 {(time.perf_counter() - t0) / 60:.0f} 分钟")
        return 0
    if not args.card:
        raise WorkloadError("需要 --card，例如 --card T4、--card A100-80GB 或 --card 24GiB（--cards 列出型号）")
    card = find_card(args.card)
    if card is None:
        try:
            card_bytes = parse_bytes(args.card)
        except ValueError:
            raise WorkloadError(f"不认识的显卡 {args.card!r}：请给型号（{'、'.join(CARDS)}）或显存大小，例如 24GiB") from None
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
    hw = card.hardware() if card else Hardware()
    if args.tflops:
        hw = replace(hw, name=f"自定义（16 位 {args.tflops} TFLOPS）", bf16_tflops=args.tflops,
                     fp32_tflops=args.tflops / 2)
    if args.link_gbps:
        hw = replace(hw, link_gbps=args.link_gbps)
    methods = METHODS if args.method == "any" else (args.method,)
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    plan = make_plan(preset, card or card_bytes, gpus=args.gpus, seq=args.seq, global_batch=args.global_batch,
                     lora_rank=args.lora_rank, top=args.top, verify=not args.no_verify, methods=methods, hw=hw,
                     config_path=args.config, progress=progress, lora_targets=args.lora_targets)
    if args.json:
        print(json.dumps(plan, ensure_ascii=False))
    else:
        print_plan(plan)
    return 0


def main(argv=None) -> int:
    from .args import ChineseArgumentParser

    parser = ChineseArgumentParser(prog="python -m vramlab.plan", description="在给定显卡上规划一次微调")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (WorkloadError, ValueError, KeyError) as e:
        print(f"错误：{e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
