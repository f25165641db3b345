"""Analytic peak-memory estimate of one training (or inference) step, with a breakdown.

No torch needed: every figure is a closed-form count of the tensors that PyTorch keeps on the device,
so the same formulas can be ported to the JavaScript calculator. The estimate is of
`torch.cuda.max_memory_allocated()` on ONE device in the steady state (optimizer state exists),
for Hugging Face transformers models with `labels=input_ids`.

How it works. Memory at any instant = what persists between steps (weights, optimizer state, and
gradients while they exist) + what autograd saved for backward + short-lived buffers. Which tensors
each op saves, and in which dtype, comes from a symbolic walk of one block's forward (`_Forward`,
per family, precision, LoRA targets, QLoRA, checkpointing), and the backward's working set from a
walk of the same tape in reverse (`_backward_peak`). The peak is the largest of these instants
(`PHASES`; `Estimate.phases` gives the total at each):

    block_forward       the last block's forward: what it saved so far, what its Python locals hold
                        and the running op (the model's inputs_embeds too)
    forward_end         end of the forward pass: all saved activations + logits, fp32 logits copy
                        and log-softmax output (+ under autocast, the cached 16-bit weight copies)
    backward_start      first backward op: saved activations + log-softmax output + its gradient +
                        the logits gradient (three B*S*V fp32 tensors: often THE peak of LM training)
    head_backward       the LM head's backward: the logits' gradient and the head's weight gradient
    block_backward      the last block's backward (after its recomputation under checkpointing)
    backward_end        all gradients exist, the first block's working set remains
    embedding_backward  (full fine-tuning, where it adds) the embedding's new gradient before it is
                        summed into .grad / with a tied head's
    optimizer_step      weights + grads + state + the optimizer's temporaries (foreach AdamW builds
                        a full-size sqrt(v) buffer)

Which tensors a block saves was read off HF GPT-2 with `torch.autograd.graph.saved_tensors_hooks`
and checked against real H200 measurements (vramlab/data/h200_gpt2_peaks.md, every row within a
few percent; run `python -m vramlab.estimate` for the table). Sources for each formula are cited in
the function that computes it.

QLoRA: `Workload(qlora=True)` (or `estimate(w, qlora=True)`; needs `w.lora_rank > 0`) means the
frozen base linear weights are bitsandbytes NF4 and every other parameter is cast to FP32 as peft's
prepare_model_for_kbit_training does; see `qlora_weight_bytes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .models import Preset, get_preset
from .workload import Workload, WorkloadError

MiB = 1024**2
KEYS = ("parameters", "gradients", "optimizer_state", "activations", "logits_and_loss", "temporaries",
        "cuda_overhead")
PHASES = ("block_forward", "forward_end", "backward_start", "head_backward", "block_backward", "backward_end",
          "embedding_backward", "optimizer_step")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# PyTorch allocates the cuBLAS workspace through its caching allocator, so it shows up in
# max_memory_allocated: aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize():
# default ":4096:8" = 32 MiB on sm90 (Hopper, e.g. H200), ":4096:2:16:8" (~8.1 MiB) elsewhere.
# One workspace per (handle, stream); the autograd engine runs CUDA backward on its own thread,
# which takes its own cuBLAS handle, so training holds two.
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 8

# peft's default LoRA target modules per family (peft.utils.constants,
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): GPT-2 c_attn, BERT/Llama query+value.
LORA_TARGETS = {"gpt2": ("qkv",), "bert": ("q", "v"), "llama": ("q", "v"), "mixtral": ("q", "v")}


# ---------------------------------------------------------------------------------------------
# Parameters (closed form)
# ---------------------------------------------------------------------------------------------

def _head_dim(p: Preset) -> int:
    return p.config.get("head_dim") or p.hidden // p.heads


def linear_shapes(p: Preset) -> dict[str, tuple[int, int, bool]]:
    """The matmul weights of ONE block: name -> (in_features, out_features, has_bias)."""
    h, f, hd = p.hidden, p.ffn_hidden, _head_dim(p)
    q, kv = p.heads * hd, p.kv_heads * hd
    if p.family == "gpt2":   # Conv1D c_attn (fused q,k,v), c_proj, c_fc, mlp.c_proj
        return {"qkv": (h, 3 * h, True), "o": (h, h, True), "up": (h, f, True), "down": (f, h, True)}
    if p.family == "bert":
        return {"q": (h, h, True), "k": (h, h, True), "v": (h, h, True), "o": (h, h, True),
                "up": (h, f, True), "down": (f, h, True)}
    shapes = {"q": (h, q, False), "k": (h, kv, False), "v": (h, kv, False), "o": (q, h, False)}
    if p.family == "llama":
        shapes.update(gate=(h, f, False), up=(h, f, False), down=(f, h, False))
    else:                    # mixtral: router + E experts of SwiGLU (weights counted in block_params)
        shapes.update(router=(h, p.config["num_local_experts"], False))
    return shapes


def block_params(p: Preset) -> int:
    """Parameters of one transformer block."""
    n = sum(i * o + (o if b else 0) for i, o, b in linear_shapes(p).values())
    h, f = p.hidden, p.ffn_hidden
    if p.family == "mixtral":
        n += p.config["num_local_experts"] * 3 * h * f
    norms = 2 * h if p.family in ("llama", "mixtral") else 2 * 2 * h   # RMSNorm has no bias
    return n + norms


def param_count(model: str | Preset) -> int:
    """Closed-form parameter count (equals `models.count_params`, without torch).

    GPT-2: V·h + P·h + L·(12h² + 13h) + 2h (lm_head tied to wte). BERT-MLM adds token types, an MLM
    transform (h² + 3h) and a decoder bias V. Llama/Mixtral: untied lm_head unless tie_word_embeddings.
    """
    p = get_preset(model) if isinstance(model, str) else model
    h, V, c = p.hidden, p.vocab, p.config
    n = p.n_layers * block_params(p) + V * h
    if p.family == "gpt2":
        n += c["n_positions"] * h + 2 * h
    elif p.family == "bert":
        n += (c["max_position_embeddings"] + 2) * h + 2 * h      # positions, token types, LayerNorm
        n += h * h + h + 2 * h + V                               # MLM transform, LayerNorm, decoder bias
    else:
        n += h + (0 if c.get("tie_word_embeddings") else V * h)  # final RMSNorm, lm_head
    return n


def matmul_weight_params(p: Preset) -> int:
    """Weights that go through a matmul each step (what autocast casts to 16-bit), incl. the LM head."""
    per_block = sum(i * o for i, o, _ in linear_shapes(p).values())
    if p.family == "mixtral":
        per_block += p.config["num_local_experts"] * 3 * p.hidden * p.ffn_hidden
    head = p.vocab * p.hidden + (p.hidden * p.hidden if p.family == "bert" else 0)
    return p.n_layers * per_block + head


def lora_target_names(p: Preset, targets: str = "default") -> tuple[str, ...]:
    """Which Linear layers LoRA adapts (names of `linear_shapes`, "mlm" = BERT's MLM transform),
    for each choice of `Workload.lora_targets` (the runner passes the same to peft):

        default     peft's default (LORA_TARGETS): GPT-2 c_attn; BERT and Llama-style q and v
        qkvo        every attention projection (GPT-2: c_attn and the attention's c_proj)
        all-linear  every Linear of the blocks (and BERT's MLM transform), never the output layer;
                    Mixtral: the attention projections (its router and experts are not nn.Linear)
    """
    if targets == "default":
        return LORA_TARGETS[p.family]
    if targets == "qkvo":
        return ("qkv", "o") if p.family == "gpt2" else ("q", "k", "v", "o")
    if targets == "all-linear":
        return tuple(k for k in linear_shapes(p) if k != "router") + (("mlm",) if p.family == "bert" else ())
    raise WorkloadError(f"--lora-targets 不支持 {targets!r}；可选：default、qkvo、all-linear")


def lora_shapes(p: Preset, targets: str = "default") -> list[tuple[int, int]]:
    """(in, out) of every adapted Linear of the model."""
    shapes = linear_shapes(p)
    names = lora_target_names(p, targets)
    out = [shapes[t][:2] for t in names if t != "mlm"] * p.n_layers
    return out + ([(p.hidden, p.hidden)] if "mlm" in names else [])


def lora_params(model: str | Preset, rank: int, targets: str = "default") -> int:
    """LoRA adapter size (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"):
    each adapted d_in x d_out weight gains A (r x d_in) and B (d_out x r): r·(d_in + d_out) params.

    With peft's default targets, r=8 on GPT-2 small (c_attn) gives 12 · 8 · (768 + 2304) = 294,912
    trainable parameters; `targets` as in `lora_target_names`.
    """
    p = get_preset(model) if isinstance(model, str) else model
    return sum(rank * (i + o) for i, o in lora_shapes(p, targets))


def nf4_bytes(n: int) -> int:
    """One bitsandbytes Linear4bit weight of n values, as the simulated device's stand-in stores it:
    packed 4-bit values (n/2 bytes), an 8-bit absmax per 64-value block and an fp32 constant per 256
    blocks (double quantization) - Dettmers et al. 2023, "QLoRA", Sec. 3: ≈ 0.516 bytes/value."""
    blocks = -(-n // 64)
    return (n + 1) // 2 + blocks + 4 * -(-blocks // 256)


def qlora_weight_bytes(n_params: int) -> float:
    """NF4 storage (Dettmers et al. 2023, "QLoRA", Sec. 3): 4 bits per weight, one absmax per
    64-weight block, itself quantized to 8 bits with an fp32 constant per 256 blocks (double
    quantization): 0.5 + 1/64 + 4/(64·256) ≈ 0.516 bytes per parameter (4.127 bits).
    """
    return n_params * (0.5 + 1 / 64 + 4 / (64 * 256))


def quantized_shapes(p: Preset) -> list[tuple[int, int]]:
    """(in, out) of every Linear QLoRA stores in 4 bits: all nn.Linear layers of the blocks (and
    BERT's MLM transform), not the output layer, as transformers' BitsAndBytesConfig does."""
    shapes = [s[:2] for k, s in linear_shapes(p).items() if k != "router"] * p.n_layers
    return shapes + ([(p.hidden, p.hidden)] if p.family == "bert" else [])


def trainable_shapes(p: Preset, w: Workload) -> list[tuple[int, ...]]:
    """The shape of every trainable tensor, in `model.parameters()` order (optimizers keep state
    per tensor; the for-loop optimizers' temporaries depend on neighbours)."""
    if w.lora_rank:
        r = w.lora_rank
        return [s for i, o in lora_shapes(p, w.lora_targets) for s in ((r, i), (o, r))]
    h, V, c = p.hidden, p.vocab, p.config
    lin = {k: [(o, i)] + ([(o,)] if b else []) for k, (i, o, b) in linear_shapes(p).items()}
    if p.family == "gpt2":      # wte, wpe; ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj; ln_f
        block = [(h,), (h,)] + lin["qkv"] + lin["o"] + [(h,), (h,)] + lin["up"] + lin["down"]
        return [(V, h), (c["n_positions"], h)] + block * p.n_layers + [(h,), (h,)]
    if p.family == "bert":      # embeddings; q, k, v, o, LN, intermediate, output, LN; MLM head
        block = lin["q"] + lin["k"] + lin["v"] + lin["o"] + [(h,), (h,)] + lin["up"] + lin["down"] + [(h,), (h,)]
        return ([(V, h), (c["max_position_embeddings"], h), (2, h), (h,), (h,)] + block * p.n_layers
                + [(h, h), (h,), (h,), (h,), (V,)])
    block = lin["q"] + lin["k"] + lin["v"] + lin["o"]
    if p.family == "llama":
        block += lin["gate"] + lin["up"] + lin["down"]
    else:
        e, f = c["num_local_experts"], p.ffn_hidden
        block += lin["router"] + [(e, 2 * f, h), (e, h, f)]
    block += [(h,), (h,)]
    return [(V, h)] + block * p.n_layers + [(h,)] + ([] if c.get("tie_word_embeddings") else [(V, h)])


def _numel(shape) -> int:
    return math.prod(shape)


# ---------------------------------------------------------------------------------------------
# Model states: weights, gradients, optimizer state
# ---------------------------------------------------------------------------------------------

BNB_BLOCKSIZE = 256          # bitsandbytes 0.50: Optimizer2State.init_state, blocksize = 256
BNB_MIN_8BIT_SIZE = 4096     # smaller tensors keep fp32 state (AdamW8bit's min_8bit_size default)


def optimizer_state_bytes(optimizer: str, n_params: int, state_bytes: int, factored_elements: int | None = None,
                          shapes: list | None = None) -> int:
    """Bytes of optimizer state for `n_params` trainable parameters stored at `state_bytes` each
    (`shapes`: the trainable tensors, for the optimizers that keep state per tensor).

    - SGD: none. SGD + momentum: 1 buffer per parameter.
    - AdamW (Loshchilov & Hutter 2019): 2 buffers, m and v (PyTorch keeps them in the param dtype).
    - 8-bit AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization";
      bitsandbytes 0.50, bitsandbytes/optim/optimizer.py, Optimizer2State.init_state): m and v as
      uint8 = 2 bytes/param, plus one fp32 absmax per 256-value block per state
      (`blocksize = 256`; older releases used 2048), i.e. 2 + 2·4/256 = 2.03 bytes/param;
      a tensor of fewer than 4096 values (min_8bit_size: biases, norms) keeps two fp32 states.
    - Adafactor (Shazeer & Stern 2018; torch.optim.Adafactor): the second moment of a matrix
      [..., r, c] is kept as a row vector [..., r, 1] and a column vector [..., 1, c]; vectors
      (biases, norms) keep a full second moment; no first moment. `factored_elements` = Σ(r + c)
      over matrices + the size of every vector (see `adafactor_factored_elements`).
    """
    if optimizer == "sgd":
        return 0
    if optimizer == "sgdm":
        return n_params * state_bytes
    if optimizer == "adamw":
        return 2 * n_params * state_bytes
    if optimizer == "adamw8bit":
        if shapes is None:
            return int(n_params * (2 + 2 * 4 / BNB_BLOCKSIZE))
        total = 0
        for s in shapes:
            n = _numel(s)
            total += 8 * n if n < BNB_MIN_8BIT_SIZE else 2 * n + 2 * 4 * -(-n // BNB_BLOCKSIZE)
        return total
    if optimizer == "adafactor":
        if factored_elements is None:
            factored_elements = (sum(adafactor_elements(s) for s in shapes) if shapes is not None
                                 else 2 * math.isqrt(n_params))
        return factored_elements * state_bytes
    raise WorkloadError(f"未知优化器 {optimizer!r}")


def adafactor_elements(shape) -> int:
    """torch.optim.Adafactor's state for one tensor: row_var [..., r, 1] + col_var [..., 1, c], or
    the full variance for a vector."""
    if len(shape) < 2:
        return _numel(shape)
    lead = _numel(shape[:-2])
    return lead * (shape[-2] + shape[-1])


def adafactor_factored_elements(p: Preset, lora_rank: int = 0, targets: str = "default") -> int:
    """Adafactor's second-moment size: rows + columns of every matrix, full size for vectors."""
    w = Workload(model=p.name, lora_rank=lora_rank, lora_targets=targets)
    return sum(adafactor_elements(s) for s in trainable_shapes(p, w))


def zero_model_state_bytes(params: int, stage: int, n_gpus: int, k: int = 12, weight_bytes: int = 2) -> int:
    """Per-device model-state bytes under ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
    Toward Training Trillion Parameter Models", Fig. 1 and Sec. 5).

    Mixed-precision Adam keeps 16-bit weights (2Ψ), 16-bit gradients (2Ψ) and K·Ψ of optimizer state
    (fp32 master weights, m and v: K = 12). Over N_d devices:

        stage 0 (plain data parallel)   (2 + 2 + K)·Ψ
        stage 1 (P_os, shard state)     (2 + 2)·Ψ + K·Ψ/N_d
        stage 2 (P_os+g, + gradients)   2·Ψ + (2 + K)·Ψ/N_d
        stage 3 (P_os+g+p, + weights)   (2 + 2 + K)·Ψ/N_d

    The paper's example, Ψ = 7.5B, N_d = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    `weight_bytes` is the size of one weight and of one gradient (2 for 16-bit, 4 for fp32).
    """
    w, g, s = weight_bytes * params, weight_bytes * params, k * params
    n = max(1, n_gpus) if stage else 1
    shard = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[stage]
    return int(w / shard[0] + g / shard[1] + s / shard[2])


# ---------------------------------------------------------------------------------------------
# Activations: a symbolic forward pass that records what autograd saves
# ---------------------------------------------------------------------------------------------

def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, selective: bool = False) -> int:
    """Activation bytes per transformer layer in 16-bit, with dropout, no parallelism
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Eq. 1):

        s·b·h·(34 + 5·a·s/h)

    34·sbh = attention 11 (QKV input 2, Q and K 4, V 2, out-proj input 2, dropout mask 1)
           + MLP 19 (input 2, GeLU input 8, GeLU output 8, dropout mask 1) + two LayerNorm inputs 4.
    5·a·s²·b: the attention score softmax output (2), its dropout mask (1) and dropout output (2).
    Their selective recomputation (Sec. 4.2) recomputes the attention core only and keeps 34·sbh.
    `saved_per_block` reproduces both for GPT-2 in fp16 with eager attention, dropout and a
    single-kernel GeLU (tests/test_estimate.py).
    """
    return s * b * h * 34 if selective else s * b * h * 34 + 5 * a * s * s * b


class _T:
    """A tensor of the symbolic forward: `n` elements of `b` bytes; `rg`: requires grad; `base`:
    the tensor whose storage it views (saving a view keeps the whole storage)."""
    __slots__ = ("n", "b", "rg", "id", "base", "ghost")

    def __init__(self, n, b, rg, id_, base=None, ghost=False):
        self.n, self.b, self.rg, self.id, self.base = n, b, rg, id_, base
        self.ghost = ghost   # exists only in backward (a gradient's cast): no forward memory


class _Op:
    """One backward node: its output, the inputs that get a gradient, what it saved (brought back
    to the device one node at a time under save_on_cpu) and the temporaries its backward adds.
    `alias`: the gradient passes through unchanged to inputs of the output's dtype (an add)."""
    __slots__ = ("out", "ins", "unpack", "temp", "alias", "saved", "attn", "grad", "early", "wcopy", "also")

    def __init__(self, out, ins, unpack=0, temp=0, alias=False, saved=(), attn=False, grad=0, early=0, wcopy=0,
                 also=()):
        self.out, self.ins, self.unpack, self.temp, self.alias, self.saved = out, ins, unpack, temp, alias, saved
        self.also = also     # further outputs whose gradients it consumes (a split's other views)
        self.attn = attn     # inside the attention module (what selective checkpointing recomputes)
        self.grad = grad     # a weight gradient this node leaves behind (.grad, without accumulation)
        self.early = early   # of its saved tensors, those a composite node frees before its own peak
        self.wcopy = wcopy   # the 16-bit weight copy its matmul saved under autocast (freed once it ran)


class _Forward:
    """Walks one forward pass of a Hugging Face model the way autograd sees it, records every
    tensor saved for backward (once per storage) and a tape of backward nodes. The rules, each
    read off PyTorch or the library:

    * dtypes. fp32: everything fp32. Pure 16-bit: weights, activations and the residual stream in
      16 bits. Mixed (fp32 weights under `torch.autocast`): matmuls (and SDPA) cast their inputs to
      16 bits and return 16 bits; layer_norm, pow, softmax run in fp32; any 16-bit + fp32 sum is
      fp32, so the residual stream stays fp32. QLoRA (`Workload.qlora`): peft's
      prepare_model_for_kbit_training casts every non-4-bit parameter to fp32 and bitsandbytes'
      Linear4bit returns its input's dtype, so the stream is fp32 in every precision.
    * Linear: its input is saved only if its weight trains (the weight gradient needs it); under
      autocast that is the 16-bit cast, one per layer (casts of non-leaf tensors are not cached).
      A frozen fp32 weight under autocast is cast anew at each use; the copy is saved by the
      matmul when the input needs a gradient (aten/src/ATen/autocast_mode.cpp, cached_cast: only
      leaf tensors that require grad are cached). A 4-bit layer saves only its packed weight.
    * LoRA (peft 0.21, lora.Linear.forward): adapters are fp32; x is cast to fp32 for lora_A
      (a copy unless x is fp32 already), then autocast casts it back to 16 bits (another copy):
      each adapted layer saves its own copy except in fp32. lora_A's r-wide output is saved too.
    * LayerNorm saves its input and per-token mean and rstd; HF's RMSNorm saves x.float() and
      rsqrt, plus the normalised x when its weight trains; GeLU (BERT's F.gelu) saves its input;
      HF GPT-2's gelu_new is Python (0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³)))) and saves x (as
      fp32 under autocast), tanh, 1 + tanh and 0.5·x; SiLU·up saves gate, silu(gate) and up.
    * Attention: SDPA (FlashAttention / memory-efficient) saves q, k, v, the output and an fp32
      logsumexp [B, heads, S rounded up to 32]; dropout is regenerated from the seed. Eager saves
      q, k (Llama: k and v repeated to all heads), the softmax output (fp32 under autocast and
      always in Llama, which passes dtype=float32), the probabilities as the second matmul takes
      them, a 1-byte mask and the dropout output with dropout, and v; its output is made
      contiguous (a copy the output projection saves if it trains).
    * dropout with p > 0 saves a 1-byte bool mask (CUDA's native_dropout).
    * Nothing is saved where nothing upstream needs a gradient (LoRA's first block before its
      adapters; with full checkpointing see `embeddings`). `mute`: inside a checkpointed module
      nothing is saved.
    * What is alive at an instant of the forward (`moment`): the tensors saved so far, those the
      running modules' Python locals still reference (`hold` / `release`, mirroring the HF, peft
      and bitsandbytes code: see `block`, `adapter`, `attention`), the running op's inputs and
      output, its temporaries, and the 16-bit weight copies made so far. A tensor nothing
      references is freed at once, as CUDA's caching allocator frees a storage when its last
      reference goes.
    """

    def __init__(self, w: Workload, p: Preset, fused_gelu: bool = False, ids: int = 0, sim: bool = False):
        self.w, self.p, self.fused_gelu, self.sim = w, p, fused_gelu, sim
        self.tok = w.batch * w.seq
        self.mixed = w.mixed
        self.lora = w.lora_rank > 0
        self.train = not self.lora
        self.nf4 = w.qlora
        self.targets = set(lora_target_names(p, w.lora_targets)) if self.lora else set()
        # bytes of a non-4-bit parameter (embeddings, norms, LM head): fp32 unless pure 16-bit
        self.pb = 4 if (w.precision == "fp32" or w.mixed or w.qlora) else 2
        self.cb = DTYPE_BYTES[w.compute_dtype_name]
        self.drop = w.dropout > 0
        self.accum = w.accum > 1
        # a weight gradient's bytes as it stays on the device (ZeRO + mixed: 16-bit; ZeRO-2/3: sharded)
        self.gb = 2 if (w.zero and w.mixed) else self.pb
        self.shards = w.gpus if w.zero >= 2 else 1
        self.saved: dict[int, int] = {}
        self.names: list[tuple[str, int]] = []
        self.tape: list[_Op] = []
        self._pending: list[int] = []      # storages saved since the last node was recorded
        self.casts = 0              # frozen weights' 16-bit copies saved by matmuls (autocast)
        self.kept = 0               # inputs a checkpoint keeps for its recomputation
        self.cached = 0             # trainable weights' 16-bit copies (autocast cache) saved by matmuls
        self.mute = False
        self.in_attn = False
        self.held: dict[int, int] = {}     # storages the running modules' Python locals reference
        self.refs: dict[int, int] = {}     # how many of those locals reference each
        self.fwd_peak = 0           # saved so far + held + an op's inputs, output and temporaries, at most
        self.fwd_peak_rc = 0        # the same with the 16-bit weight copies made so far (autocast)
        self.fwd_peak_off = 0       # under save_on_cpu: the same without the saved tensors (on the host)
        self.wheld = 0              # 16-bit weight copies made so far, as a recomputation keeps them
        self.wcache = 0             # ... in autocast's cache (trainable fp32 weights)
        self.wsave = 0              # ... of frozen weights, saved by their matmul
        self.model_locals: list[_T] = []   # what the model's forward keeps in locals while the blocks run
        self.leaf: _T | None = None        # see embeddings()
        self._ids = ids

    # -- tensors ----------------------------------------------------------------------------
    def t(self, n: int, b: int, rg: bool) -> _T:
        self._ids += 1
        return _T(n, b, rg, self._ids)

    def view(self, x: _T, n: int) -> _T:
        self._ids += 1
        return _T(n, x.b, x.rg, self._ids, x.base or x)

    def save(self, x: _T, name: str) -> int:
        """Record `x` as saved; returns its bytes (what save_on_cpu brings back for this node)."""
        s = x.base or x
        if not self.mute:
            if s.id not in self.saved:
                self.saved[s.id] = s.n * s.b
                self.names.append((name, s.n * s.b))
            self._pending.append(s.id)
        return x.n * x.b

    def hold(self, *xs: _T) -> None:
        """A Python local of the running module references `xs` (alive until as many `release`s)."""
        for x in xs:
            s = x.base or x
            if not s.ghost:
                self.held[s.id] = s.n * s.b
                self.refs[s.id] = self.refs.get(s.id, 0) + 1

    def release(self, *xs: _T) -> None:
        for x in xs:
            sid = (x.base or x).id
            if sid in self.refs:
                self.refs[sid] -= 1
                if not self.refs[sid]:
                    del self.refs[sid], self.held[sid]

    def moment(self, alive=(), extra: int = 0) -> None:
        """One instant of the forward: what autograd saved so far, what locals hold, the tensors
        `alive` (an op's inputs and output: each storage once) and `extra` bytes of temporaries."""
        dev = dict(self.held)
        for x in alive:
            s = x.base or x
            if not s.ghost:
                dev[s.id] = s.n * s.b
        live = {**self.saved, **dev}
        self.fwd_peak = max(self.fwd_peak, sum(live.values()) + extra + self.wcache + self.wsave)
        self.fwd_peak_off = max(self.fwd_peak_off, sum(dev.values()) + extra + self.wcache)
        self.fwd_peak_rc = max(self.fwd_peak_rc, sum(live.values()) + extra + self.wheld)

    def op(self, out: _T, ins, unpack: int = 0, temp: int = 0, alias: bool = False, fwd: int = 0,
           grad: int = 0, early: int = 0, wcopy: int = 0, account: bool = True) -> _T:
        self.wheld += wcopy                  # the 16-bit weight copy made for this matmul
        if account and not out.ghost:        # while it runs, its inputs and output are alive
            self.moment(list(ins) + [out], fwd)
        saved, self._pending = tuple(self._pending), []
        if out.rg:
            self.tape.append(_Op(out, [x for x in ins if x.rg], unpack, temp, alias, saved, self.in_attn, grad, early,
                                 wcopy))
        return out

    def total(self) -> int:
        return sum(self.saved.values())

    def cast(self, x: _T, b: int) -> _T:
        return x if x.b == b else self.op(self.t(x.n, b, x.rg), [x])

    # -- layers -----------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, int]:
        if name == "head":
            return self.p.hidden, self.p.vocab
        if name == "mlm":
            return self.p.hidden, self.p.hidden
        i, o, _ = linear_shapes(self.p)[name]
        return i, o

    def linear(self, x: _T, name: str) -> _T:
        i, o = self.shape(name)
        self.hold(x)                         # the module's argument, until it returns
        if self.nf4 and name != "head":
            # bitsandbytes Linear4bit: x.to(compute dtype), dequantise, matmul (the dequantised
            # weight is freed), .to(x's dtype); in backward the weight is dequantised again and the
            # gradient cast both ways
            casts = self.tok * (i + o) * self.cb if self.cb != x.b else 0
            self.moment([x], i * o * self.cb + (casts or self.tok * o * x.b))
            y = self.op(self.t(self.tok * o, x.b, x.rg), [x], unpack=nf4_bytes(i * o),
                        temp=i * o * self.cb + casts, fwd=casts)
        else:
            xc = self.cast(x, 2) if self.mixed else x
            wb = 2 if self.mixed else self.pb
            unpack = wcopy = 0
            if self.train:
                unpack += self.save(xc, f"{name} input")
                if self.mixed and not self.mute:
                    self.cached += i * o * 2
            elif self.mixed and x.rg and not self.mute:
                self.casts += i * o * 2
            if self.mixed and (x.rg or self.train) and not self.w.zero:
                wcopy = i * o * 2
            # the 16-bit copy stays in autocast's cache (a trainable weight) or saved by the matmul
            # (a frozen one, when x needs a gradient); else it lives only while the matmul runs
            wcache = i * o * 2 if (self.mixed and self.train and not self.w.zero) else 0
            wsave = i * o * 2 if (self.mixed and not self.train and x.rg and not self.mute and not self.w.zero) else 0
            self.wcache, self.wsave = self.wcache + wcache, self.wsave + wsave
            transient = i * o * 2 if (self.mixed and not self.w.zero and not (wcache or wsave)) else 0
            if x.rg:
                unpack += i * o * wb                    # the weight (or its 16-bit copy), saved for dx
            temp = grad = 0
            if self.train:     # the weight gradient: 16-bit then fp32 under autocast; added in place with accumulation
                temp = i * o * (2 if self.mixed else 0) + (i * o * self.gb if self.accum else 0)
                grad = 0 if self.accum else i * o * self.gb // self.shards
            y = self.op(self.t(self.tok * o, 2 if self.mixed else x.b, x.rg or self.train), [xc], unpack, temp,
                        grad=grad, wcopy=wcopy, fwd=transient)
        if name in self.targets:
            y = self.adapter(x, y, name)
        self.release(x)
        return y

    def adapter(self, x: _T, y: _T, name: str) -> _T:
        """peft 0.21 lora.Linear.forward: `result = base_layer(x)`; `x = x.to(lora_A.weight.dtype)`
        (fp32 adapters: a copy unless x is fp32, kept in the local until forward returns);
        `result = result + lora_B(lora_A(x)) * scaling` (under autocast lora_A casts x back to 16
        bits, and saves that copy), then `result.to(its old dtype)`."""
        i, o = self.shape(name)
        r, n = self.w.lora_rank, self.tok * o
        self.hold(y)
        x32 = self.cast(x, 4)
        self.hold(x32)
        xa = self.op(self.t(x.n, 2, x.rg), [x32]) if self.mixed else x32
        ab = 2 if self.mixed else 4
        a = self.op(self.t(self.tok * r, ab, True), [xa], self.save(xa, f"{name} lora_A input") + r * i * ab,
                    grad=0 if self.accum else r * i * 4)
        lo = self.op(self.t(n, ab, True), [a], self.save(a, f"{name} lora_A output") + r * o * ab,
                     grad=0 if self.accum else r * o * 4)
        if self.mixed and not self.mute:
            self.cached += r * (i + o) * 2
        sb = max(y.b, ab)                    # the sum's dtype (type promotion)
        self.moment([lo], n * ab)            # lora_B's output and its scaled copy
        self.moment([], n * ab + n * sb)     # the scaled copy and the sum
        self.release(y)
        out = self.op(self.t(y.n, y.b, True), [y, self.cast_grad(lo, y.b)], alias=True, account=False)
        if sb != y.b:
            self.moment([], n * sb + n * y.b)  # the sum and its cast back
        self.release(x32)
        return out

    def layernorm(self, x: _T, name: str) -> _T:
        if not (x.rg or self.train):
            return self.t(x.n, 4 if self.mixed else x.b, False)
        xs = self.cast(x, 4) if self.mixed else x
        u = self.save(xs, f"{name} input") + self.save(self.t(2 * self.tok, 4, False), f"{name} mean/rstd")
        return self.op(self.t(x.n, xs.b, True), [xs], u)

    def rmsnorm(self, x: _T, name: str) -> _T:
        """HF LlamaRMSNorm: h = x.float(); h * rsqrt(mean(h²) + eps); weight * h.to(x.dtype)."""
        out_b = max(self.pb, x.b)
        if not (x.rg or self.train):
            return self.t(x.n, out_b, False)
        h32 = self.cast(x, 4)
        self.moment([x, h32], x.n * 4)       # h² (then h·rsqrt), fp32
        u = 0
        if x.rg:
            u += self.save(h32, f"{name} x.float()") + self.save(self.t(self.tok, 4, False), f"{name} rsqrt")
        if self.train:
            u += self.save(self.t(x.n, x.b, True), f"{name} normalised")
        # forward: h·rsqrt (fp32) and its cast to x's dtype (saved when the weight trains) live
        # while the weight multiplies; backward: the gradients through weight·h, the cast, h·rsqrt
        # and pow/mean (fp32)
        fwd = (x.n * 4 if x.b != 4 else 0) + (0 if self.train else x.n * x.b)
        return self.op(self.t(x.n, out_b, True), [h32], u, temp=2 * x.n * 4, fwd=fwd)

    def dropout(self, x: _T, name: str) -> _T:
        if not self.drop:
            return x
        u = self.save(self.t(x.n, 1, False), f"{name} dropout mask") if x.rg else 0
        return self.op(self.t(x.n, x.b, x.rg), [x], u)

    def add(self, a: _T, b: _T) -> _T:
        out = self.t(a.n, max(a.b, b.b), a.rg or b.rg)
        return self.op(out, [self.cast_grad(a, out.b), self.cast_grad(b, out.b)], alias=True)

    def cast_grad(self, x: _T, b: int) -> _T:
        """An input of a mixed-dtype sum: its gradient is cast from the sum's dtype (a new tensor
        in backward; the forward promotes types without one)."""
        if x.b == b:
            return x
        self._ids += 1
        return self.op(_T(x.n, b, x.rg, self._ids, ghost=True), [x])

    def gelu_new(self, u: _T) -> _T:
        if not u.rg:
            return self.t(u.n, u.b, False)
        if self.fused_gelu:
            return self.op(self.t(u.n, u.b, True), [u], self.save(u, "gelu input"))
        x32 = u if (u.b == 4 or not self.mixed) else self.t(u.n, 4, True)
        tb = 4 if self.mixed else u.b
        self.save(x32, "gelu: x for x³")
        self.save(self.t(u.n, tb, True), "gelu: tanh")
        self.save(self.t(u.n, tb, True), "gelu: 1+tanh")
        self.save(self.t(u.n, u.b, True), "gelu: 0.5·x")
        # backward: a chain of elementwise nodes. The first, (0.5·x)·(1 + tanh)'s, makes two
        # gradients of the product's dtype while all four saved tensors are alive; under save_on_cpu
        # the most is at pow's node (its x brought back), with about three f-sized gradients of
        # tanh's dtype and one of x's alive, and tanh, 1 + tanh and 0.5·x already freed
        return self.op(self.t(u.n, max(u.b, tb), True), [u], x32.n * x32.b, temp=3 * u.n * tb + u.n * u.b,
                       early=u.n * (tb + 2 * u.b))

    def gelu(self, u: _T) -> _T:
        s = self.save(u, "gelu input") if u.rg else 0
        return self.op(self.t(u.n, u.b, u.rg), [u], s)

    def swiglu(self, x: _T) -> _T:
        """HF LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), in Python's order: silu(gate)
        exists while up_proj runs; the product is down_proj's input."""
        g = self.linear(x, "gate")
        s = self.op(self.t(g.n, g.b, g.rg), [g], self.save(g, "gate") if g.rg else 0)
        self.hold(s)
        u = self.linear(x, "up")
        unpack = (self.save(s, "silu(gate)") if u.rg else 0) + (self.save(u, "up") if s.rg else 0)
        m = self.op(self.t(g.n, max(s.b, u.b), s.rg or u.rg), [s, u], unpack)
        self.release(s)
        return self.linear(m, "down")

    def attention(self, q: _T, k: _T, v: _T, qkv: _T | None = None) -> _T:
        """q, k, v (views of `qkv` for GPT-2). See the class docstring for what each kernel saves."""
        p, w = self.p, self.w
        rg = q.rg or k.rg or v.rg
        hd = _head_dim(p)
        qd = p.heads * hd
        low = (lambda x: self.cast(x, 2)) if self.mixed else (lambda x: x)
        ob = 2 if self.mixed else q.b
        ins = [qkv] if qkv is not None and not (self.mixed and qkv.b == 4) else None
        if w.attention == "sdpa":
            q2, k2, v2 = low(q), low(k), low(v)
            out = self.t(self.tok * qd, ob, rg)
            lse = self.t(w.batch * p.heads * math.ceil(w.seq / 32) * 32, 4, False)
            u = 0
            if rg:
                u = sum(self.save(x, "q, k, v") for x in (q2, k2, v2)) + self.save(out, "attention output") \
                    + self.save(lse, "logsumexp")
            flash = q2.b == 2 and p.kv_heads == p.heads and hd <= 256 and hd % 8 == 0
            temp = lse.n * 4 + (w.batch * w.seq * p.heads * math.ceil(hd / 32) * 32 * 4 if flash else 0)
            if ins is not None:
                temp += qkv.n * qkv.b            # dq, dk, dv before they are concatenated into d(qkv)
            return self.op(out, ins or [q2, k2, v2], u, temp)
        scores = w.batch * p.heads * w.seq * w.seq
        rep = p.family in ("llama", "mixtral") and p.kv_heads < p.heads
        if rep:     # repeat_kv: eager_attention_forward's locals until it returns
            k, v = self.op(self.t(self.tok * qd, k.b, k.rg), [k]), self.op(self.t(self.tok * qd, v.b, v.rg), [v])
            self.hold(k, v)
        # GPT-2's q, k, v are strided views of c_attn's output: matmul reshapes them into
        # contiguous copies (those are saved, not c_attn's output); v's at the second matmul
        q2, k2 = self.contiguous(low(q)), self.contiguous(low(k))
        s_in = 2 if (self.mixed or q.b == 2) else 4          # q·kᵀ's dtype
        sm = 4 if (p.family in ("llama", "mixtral") or self.mixed or q.b == 4) else 2   # softmax output
        pm = 2 if self.mixed else q.b                        # probabilities as the second matmul takes them
        qk = self.op(self.t(scores, s_in, rg), [q2, k2], self.save(q2, "q (matmul)") + self.save(k2, "k (matmul)")
                     if rg else 0)
        qk = self.op(self.t(scores, s_in, rg), [qk])        # scaling (and the causal mask)
        probs = self.t(scores, sm, rg)
        if self.sim and sm == 4 and s_in == 2:
            qk = self.cast(qk, 4)    # the CPU has no half_to_float softmax: it upcasts first (SIM_DEVICE_NOTES)
        # softmax's backward returns the scores' dtype (CUDA's half_to_float kernel)
        probs = self.op(probs, [qk], self.save(probs, "softmax(scores)") if rg else 0)
        # the weights dropout sees: Llama's softmax(...).to(query.dtype), GPT-2's .type(value.dtype),
        # BERT's softmax output as it is
        pd = {"llama": q.b, "mixtral": q.b, "gpt2": v.b}.get(p.family, sm)
        if self.drop:
            mask = self.save(self.t(scores, 1, False), "attention dropout mask") if rg else 0
            probs = weights = self.op(self.t(scores, pd, rg), [self.cast(probs, pd)], mask)
            probs = self.cast(probs, pm)
            if rg:
                self.save(probs, "attention dropout output")
        else:
            weights = probs
            probs = self.cast(probs, pm)
            weights = weights if pd == weights.b else probs
            if rg:
                self.save(probs, "probabilities (matmul)")
        # HF returns the attention weights; the decoder layer keeps them (`_`) until it returns
        self.hold(weights)
        v2 = self.contiguous(low(v))
        unpack = (probs.n * probs.b + self.save(v2, "v (matmul)")) if rg else 0
        out = self.t(self.tok * qd, ob, rg)
        # forward: the product, then its transpose(1, 2).contiguous() copy
        out = self.op(out, [probs, v2], unpack, temp=self.tok * qd * ob, fwd=self.tok * qd * ob)
        if rep:
            self.release(k, v)
        return out

    def contiguous(self, x: _T) -> _T:
        """A view matmul cannot take as it is (GPT-2's q, k, v) is copied; its gradient passes through."""
        return x if x.base is None else self.op(self.t(x.n, x.b, x.rg), [x])

    def moe(self, x: _T) -> _T:
        """Mixtral's sparse MoE block with transformers 5's grouped_mm experts
        (integrations/moe.py, grouped_mm_experts_forward): the router (logits, fp32 softmax, top-k);
        the S = k·n rows the tokens send to their experts, gathered; one grouped matmul to gate
        and up (2f wide) and a masked copy; SwiGLU on its two halves; one grouped matmul down, a
        masked copy weighted by the router, back in token order and summed over the k experts.
        Three backward nodes: the down matmul and weighting, SwiGLU, the gather and gate_up
        matmul. A grouped matmul keeps its input only when the expert weights train, and the
        weights when its input needs a gradient."""
        p, n, h, f = self.p, self.tok, self.p.hidden, self.p.ffn_hidden
        k_, e = p.config["num_experts_per_tok"], p.config["num_local_experts"]
        a, rows = (2 if self.mixed else x.b), k_ * n
        rg = x.rg or self.train
        u = 0
        if rg:
            u += self.save(self.t(n * e * (a + 4), 1, False), "router logits, softmax")
        if self.train:
            u += self.save(self.t(rows * h, a, False), "expert inputs")
        if x.rg:
            u += e * 2 * f * h * self.pb
        gu = self.op(self.t(rows * 2 * f, a, rg), [x], u, temp=rows * h * a, fwd=rows * h * a + rows * 2 * f * a,
                     grad=0 if (self.accum or not self.train) else e * 2 * f * h * self.gb // self.shards)
        u = (self.save(gu, "gate, up") + self.save(self.t(rows * f, a, rg), "silu(gate)")) if rg else 0
        prod = self.op(self.t(rows * f, a, rg), [gu], u, fwd=rows * f * a)
        u = self.save(prod, "down input") if self.train else 0
        if rg:
            u += self.save(self.t(rows * h, a, False), "expert outputs")
        if x.rg:
            u += e * h * f * self.pb
        return self.op(self.t(n * h, a, rg), [prod], u, temp=2 * rows * h * a, fwd=3 * rows * h * a,
                       grad=0 if (self.accum or not self.train) else e * h * f * self.gb // self.shards)

    # -- modules ----------------------------------------------------------------------------
    def checkpointed(self, x: _T, run):
        """Selective checkpointing: the attention module keeps only its input (vramlab's runner
        wraps it in torch.utils.checkpoint), and saves nothing else."""
        sel = self.w.checkpointing == "selective"
        if sel:
            self.kept += x.n * x.b
            if self.w.offload != "activations" or _kwarg_checkpoint_input(self.w, self.p):
                self.hold(x)         # kept on the device for the recomputation (see activation_bytes)
        self.mute, self.in_attn = sel, True
        try:
            return run(x)
        finally:
            self.mute, self.in_attn = False, False

    def embeddings(self) -> _T:
        """The embeddings' output (the first block's input). Under LoRA with full checkpointing
        the word embeddings' output requires grad: transformers' gradient_checkpointing_enable()
        calls enable_input_require_grads() for every model whose main input is input_ids
        (modeling_utils.py, transformers 5), a forward hook doing `output.requires_grad_(True)`,
        so that gradients reach the checkpointed blocks' frozen weights' inputs. It makes that
        output a leaf that requires grad: its AccumulateGrad node holds it until the graph is freed
        (`self.leaf`), and everything after it is differentiated."""
        p, h = self.p, self.p.hidden
        leaf = self.lora and self.w.checkpointing == "full"
        x = self.t(self.tok * h, self.pb, self.train or leaf)
        self.leaf = x if leaf else None
        self.model_locals = [x]          # inputs_embeds (GPT-2 also position_embeds, [1, S, h])
        if p.family == "gpt2":
            pos = self.t(self.w.seq * h, self.pb, self.train)
            self.model_locals.append(pos)
            x = self.op(self.t(x.n, x.b, x.rg or pos.rg), [x, pos], alias=True)
        if p.family == "bert":
            x = self.layernorm(x, "embeddings LayerNorm")
        if p.family in ("gpt2", "bert"):
            x = self.dropout(x, "embeddings")
        if p.family == "bert":
            self.model_locals = [x]      # BertModel keeps embedding_output, the encoder's input
        return x

    def block(self, x: _T) -> _T:
        """One block, as HF writes it. What Python locals keep alive besides autograd: the block's
        input (the model's loop variable and the layer's `residual`) for the whole block; the
        sublayer's (normalised) input while the sublayer runs; the attention's q, k, v until it
        returns; the residual after attention while the MLP runs."""
        f = self.p.family
        self.hold(x)
        if f == "gpt2":
            h = self.layernorm(x, "ln_1")
            self.hold(h)

            def attn(h):
                qkv = self.linear(h, "qkv")
                self.hold(qkv)           # query, key, value: views of c_attn's output
                q, k, v = (self.view(qkv, qkv.n // 3) for _ in range(3))
                if qkv.rg:               # SplitBackward: once the three views' gradients are in, one d(qkv)
                    self.tape.append(_Op(q, [qkv], attn=self.in_attn, also=(k, v)))
                o = self.dropout(self.linear(self.attention(q, k, v, qkv), "o"), "attention output")
                self.release(qkv)
                return o
            a = self.checkpointed(h, attn)
            self.release(h)
            r = self.add(x, a)
            self.hold(r)
            h2 = self.layernorm(r, "ln_2")
            self.hold(h2)
            u = self.linear(h2, "up")
            d = self.dropout(self.linear(self.gelu_new(u), "down"), "MLP output")
            self.release(h2)
            y = self.add(r, d)
            self.release(r, x)
            return y
        if f == "bert":
            def attn(x):
                q, k, v = self.linear(x, "q"), self.linear(x, "k"), self.linear(x, "v")
                self.hold(q, k, v)
                o = self.attention(q, k, v)
                self.release(q, k, v)
                o = self.dropout(self.linear(o, "o"), "attention output")
                return self.layernorm(self.add(o, x), "attention LayerNorm")
            a = self.checkpointed(x, attn)
            self.hold(a)                 # attention_output, the FFN's input and residual
            d = self.dropout(self.linear(self.gelu(self.linear(a, "up")), "down"), "output")
            y = self.layernorm(self.add(d, a), "output LayerNorm")
            self.release(a, x)
            return y
        # llama / mixtral: RoPE multiplies by cos/sin in the embeddings' dtype (saves only those)
        h = self.rmsnorm(x, "input RMSNorm")
        self.hold(h)

        def attn(h):
            q, k, v = self.linear(h, "q"), self.linear(h, "k"), self.linear(h, "v")
            self.hold(q, k, v)
            # q·cos + rotate_half(q)·sin: both products exist while their sum is written
            q2 = self.op(self.t(q.n, max(q.b, self.pb), q.rg), [q], temp=q.n * max(q.b, self.pb),
                         fwd=2 * q.n * max(q.b, self.pb))
            self.hold(q2)
            k2 = self.op(self.t(k.n, max(k.b, self.pb), k.rg), [k], temp=k.n * max(k.b, self.pb),
                         fwd=2 * k.n * max(k.b, self.pb))
            self.hold(k2)
            self.release(q, k)              # rebound to the rotated ones
            o = self.linear(self.attention(q2, k2, v), "o")
            self.release(q2, k2, v)
            return o
        a = self.checkpointed(h, attn)
        self.release(h)
        r = self.add(x, a)
        self.hold(r)
        h2 = self.rmsnorm(r, "post-attention RMSNorm")
        self.hold(h2)
        d = self.swiglu(h2) if f == "llama" else self.moe(h2)
        self.release(h2)
        y = self.add(r, d)
        self.release(r, x)
        return y

    def head(self, x: _T) -> _T:
        """Final norm and LM head (BERT: the MLM transform first); returns the logits."""
        f = self.p.family
        if f == "gpt2":
            x = self.layernorm(x, "ln_f")
        elif f == "bert":
            x = self.layernorm(self.gelu(self.linear(x, "mlm")), "MLM LayerNorm")
        else:
            x = self.rmsnorm(x, "final RMSNorm")
        return self.linear(x, "head")


def _backward_peak(tape: list[_Op], grad_out: _T, saved: dict[int, int], offload: bool,
                   recompute: str = "none", sim: bool = False) -> int:
    """Walk `tape` backwards from the gradient of `grad_out`: the most memory the block's saved
    tensors still waiting for their node plus the gradients in flight (and a node's temporaries
    and, under save_on_cpu, its saved tensors brought back) take at any node. A node's saved
    tensors are freed once it ran (retain_graph=False); a gradient is freed once its node ran; a
    gradient that meets an existing one is added to it in place
    (torch/csrc/autograd/input_buffer.cpp, accumulate); an add passes its output's gradient itself
    to its inputs of the same dtype (one storage, counted once). `recompute` ("full": the whole
    block, "selective": its attention module) is run again in backward by torch.utils.checkpoint,
    which keeps what the recomputation saves on the device even under save_on_cpu (its own
    saved-tensor hooks are the innermost)."""
    def resident(op):
        return not offload or recompute == "full" or (recompute == "selective" and op.attn)
    keep = {sid for op in tape if resident(op) for sid in op.saved}
    remaining = {sid: b for sid, b in saved.items() if sid in keep}
    later = {}                  # selective: the attention module's tensors exist once it is recomputed
    if recompute == "selective":
        attn = {sid for op in tape if op.attn for sid in op.saved}
        later = {sid: remaining.pop(sid) for sid in list(remaining) if sid in attn}
    # 16-bit weight copies the matmuls saved (autocast): on the device until their node ran
    for i, op in enumerate(tape):
        if op.wcopy and resident(op):
            (later if (recompute == "selective" and op.attn) else remaining)[("w", i)] = op.wcopy
    refs: dict[int, int] = {}
    for op in tape:
        for sid in op.saved:
            refs[sid] = refs.get(sid, 0) + 1
    live = {grad_out.id: grad_out.n * grad_out.b}
    held = sum(remaining.values())
    peak = held + live[grad_out.id]
    for idx in range(len(tape) - 1, -1, -1):
        op = tape[idx]
        g = live.get(op.out.id)
        if g is None:
            continue
        if op.attn and later:
            held += sum(later.values())
            remaining.update(later)
            later = {}
        aliases = [x for x in op.ins if op.alias and x.b == op.out.b]
        new: dict[int, int] = {}
        for x in op.ins:
            if x not in aliases:
                new[x.id] = new.get(x.id, 0) + x.n * x.b
        held += op.grad
        peak = max(peak, held + sum(live.values()) + sum(new.values()) + op.temp
                   + (-op.early if resident(op) else op.unpack))
        if sim:     # SIM_DEVICE_NOTES: two gradients of one tensor are summed into a third
            summed = sum(size for xid, size in new.items() if xid in live)
            if summed:
                peak = max(peak, held + sum(live.values()) + sum(new.values()) + summed)
        del live[op.out.id]
        for x in op.also:
            live.pop(x.id, None)
        keeper = min((x.id for x in aliases), default=None)
        for x in aliases:
            if x.id not in live:
                live[x.id] = g if x.id == keeper else 0
        for xid, size in new.items():
            live.setdefault(xid, size)
        for sid in op.saved:
            refs[sid] -= 1
            if refs[sid] == 0 and sid in remaining:
                held -= remaining.pop(sid)
        held -= remaining.pop(("w", idx), 0)
    return peak


def _forward(w: Workload, p: Preset, fused_gelu: bool = False, recompute: str | None = None,
             sim: bool = False) -> dict:
    """Run `_Forward` over the model: saved bytes of the embeddings, the first block (LoRA: its
    input needs no gradient), every later block, and the head; frozen-weight copies; the logits;
    the peak of the gradients in flight while a block runs backward (`*_ws`)."""
    f = _Forward(w, p, fused_gelu, sim=sim)
    x_in = f.embeddings()
    f1 = _Forward(w, p, fused_gelu, f._ids, sim)
    x = f1.block(x_in)
    f2 = _Forward(w, p, fused_gelu, f1._ids, sim)
    y = f2.block(x)
    f3 = _Forward(w, p, fused_gelu, f2._ids, sim)
    logits = f3.head(y)
    out = {"block_input": x_in.n * x_in.b, "logits_bytes_per_elem": logits.b,
           "first_fwd": f1.fwd_peak, "rest_fwd": f2.fwd_peak, "first_fwd_rc": f1.fwd_peak_rc,
           "rest_fwd_off": f2.fwd_peak_off,
           "rest_fwd_rc": f2.fwd_peak_rc, "out_bytes": y.n * y.b,
           "rest_wcache": f2.wcache, "rest_wsave": f2.wsave,
           # whether a block's backward keeps its input's storage (e.g. RMSNorm's x.float() of fp32 x)
           "first_saves_input": x_in.id in f1.saved, "rest_saves_input": x.id in f2.saved}
    offload = w.offload == "activations"
    # the model's locals (inputs_embeds, ...) while the blocks run, where no other count has them
    # on the device; the leaf enable_input_require_grads makes, for the whole step
    counted = set() if offload else set(f.saved) | (set() if w.checkpointing == "full" else set(f1.saved))
    if w.checkpointing == "full" and not offload:
        counted.add(x_in.id)             # the first checkpoint's input
    leaf = f.leaf
    out["leaf"] = 0 if leaf is None or leaf.id in counted else leaf.n * leaf.b
    out["model_held"] = sum(t.n * t.b for t in f.model_locals if t.id not in counted and t is not leaf)
    for part, fw in (("emb", f), ("first", f1), ("rest", f2), ("head", f3)):
        out[part], out[part + "_casts"], out[part + "_kept"], out[part + "_cached"] = \
            fw.total(), fw.casts, fw.kept, fw.cached
    # the backward of one block with everything it saves (a checkpointed block is recomputed)
    out["first_grads"] = sum(op.grad for op in f1.tape)
    rc = recompute or w.checkpointing
    out["first_ws"] = _backward_peak(f1.tape, x, f1.saved, offload, rc, sim)
    out["rest_ws"] = _backward_peak(f2.tape, y, f2.saved, offload, rc, sim)
    return out


def saved_per_block(w: Workload, p: Preset | None = None, first: bool = False,
                    fused_gelu: bool = False) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor autograd saves for one block, as `_Forward` counts them
    (checkpointing as in `w`: selective drops the attention module's tensors)."""
    p = p or get_preset(w.model)
    f = _Forward(w, p, fused_gelu)
    x = f.embeddings()
    if not first:
        x = f.block(x)
    mark = len(f.names)
    f.block(x)
    return f.names[mark:]


def activation_bytes(w: Workload, p: Preset | None = None) -> int:
    """Bytes of saved activations on the device at the end of the forward pass (one micro-batch).

    - none: what `_Forward` records for the embeddings, every block and the head.
    - full checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; HF uses
      torch.utils.checkpoint, non-reentrant): each block keeps only its input (B·S·h in the stream's
      dtype); one block is recomputed at a time in backward.
    - selective: the attention module of each block is checkpointed instead (see `_Forward`).
    - offload="activations" (torch.autograd.graph.save_on_cpu): saved tensors live in host memory,
      the positional inputs a checkpoint keeps too (non-reentrant torch.utils.checkpoint saves them
      with save_for_backward, through the same hooks); what a recomputation saves stays on the
      device (its hooks are innermost). Keyword arguments are different: `recompute_fn` closes over
      `kwargs` (torch/utils/checkpoint.py, `_checkpoint_without_reentrant_generator`:
      `fn(*args, **kwargs)`), so a tensor passed by keyword stays on the device. transformers'
      Llama-family decoder layers call `self.self_attn(hidden_states=hidden_states, ...)`, so under
      selective checkpointing each layer's attention input stays (GPT-2 and BERT pass it
      positionally: offloaded).
    Gradient accumulation does not change this: only one micro-batch is in flight.
    """
    return _activations(w, p or get_preset(w.model))["total"]


def _kwarg_checkpoint_input(w: Workload, p: Preset) -> bool:
    """Whether the selectively checkpointed attention module gets its input by keyword (kept on
    the device by the checkpoint's recompute closure even under save_on_cpu; see `activation_bytes`)."""
    return w.checkpointing == "selective" and p.family in ("llama", "mixtral")


def _activations(w: Workload, p: Preset, sim: bool = False) -> dict:
    fw = _forward(w, p, sim=sim)
    L = p.n_layers
    parts = ("emb", "head") if w.checkpointing == "full" else ("emb", "first", "rest", "head")
    mult = {"emb": 1, "first": 1, "rest": L - 1, "head": 1}
    saved, casts, cached, kept = (sum(mult[k] * fw[k + suffix] for k in parts)
                                  for suffix in ("", "_casts", "_cached", "_kept"))
    if w.checkpointing == "full":            # checkpoint inputs: kept by the recomputation, never offloaded
        kept = L * fw["block_input"]
    if w.offload == "activations":      # positional checkpoint inputs go through the saved-tensor hooks too
        saved, casts, cached = 0, 0, 0
        kept = kept if _kwarg_checkpoint_input(w, p) else 0
    return {"total": saved + kept, "saved": saved, "kept": kept, "casts": casts, "cached": cached, "forward": fw}


def logits_bytes(w: Workload, p: Preset | None = None, logits_b: int | None = None) -> dict[str, int]:
    """The LM head and loss, the usual peak of LM training (N = B·S tokens, V = vocab).

    HF's ForCausalLMLoss upcasts: `logits.float()`, then cross_entropy = log_softmax + nll_loss.
      forward_end:    logits (16-bit or fp32) + its fp32 copy (absent when already fp32) + log_softmax
                      output (fp32, saved for backward)
      backward_start: log_softmax output + nll_loss's gradient + log_softmax's gradient: 3 fp32 N·V
    BERT's MLM loss has no .float(): 16-bit logits give a 16-bit loss unless autocast runs it in fp32.
    Plus the shifted int64 labels (8 bytes/token).
    """
    p = p or get_preset(w.model)
    lb = logits_b if logits_b is not None else _forward(w, p)["logits_bytes_per_elem"]
    nv = w.batch * w.seq * p.vocab
    loss_b = 2 if (p.family == "bert" and lb == 2 and not w.mixed) else 4
    labels = 8 * w.batch * w.seq
    fwd = nv * (lb + (loss_b if lb != loss_b else 0) + loss_b) + labels
    bwd = 3 * nv * loss_b + labels
    return {"forward_end": fwd, "backward_start": bwd}


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------

@dataclass
class Estimate:
    workload: Workload
    total_bytes: int                      # estimated peak allocated bytes on ONE device
    breakdown: dict[str, int]             # KEYS, in order, at the peak phase
    notes: dict[str, str]                 # per key: learner-facing explanation with the formula
    params: int
    trainable_params: int
    peak_phase: str = "backward_start"    # one of PHASES
    phases: dict[str, int] = field(default_factory=dict)   # total at each phase

    def to_dict(self) -> dict:
        return {"total_bytes": int(self.total_bytes), "breakdown": {k: int(self.breakdown[k]) for k in KEYS},
                "notes": dict(self.notes), "workload": self.workload.to_dict(), "params": int(self.params),
                "trainable_params": int(self.trainable_params), "peak_phase": self.peak_phase,
                "phases": {k: int(v) for k, v in self.phases.items()}}


def _mib(x: float) -> str:
    return f"{x / MiB:,.0f} MiB"


# Where vramlab's simulated device (on the CPU, under a TorchDispatchMode) allocates differently
# from CUDA. `estimate(w, device="sim")` adds them, so that the estimate can be checked against the
# simulated device; the default is CUDA. Each is a property of the CPU run, not of the model:
#
# * the autograd engine sums two gradients of one tensor in place only when the old one is a
#   plain tensor: `can_accumulate_inplace` (torch/csrc/autograd/input_buffer.cpp) asks
#   `isTensorSubclassLike`, which is true whenever a dispatch mode is active
#   (aten/src/ATen/TensorSubclassLikeUtils.h). Under the simulated device's mode every sum is out
#   of place: a tied embedding's two V·h gradients meet in a third tensor, and so do the gradients
#   of a tensor two layers read (q/k/v's input, a LoRA layer's input: base and adapter).
# * CUDA's softmax(x, dtype=float32) on a 16-bit x runs one half_to_float kernel whose backward
#   returns 16 bits; the CPU casts x to fp32 first, so its backward makes an fp32 gradient of the
#   scores and then casts it (eager attention).
SIM_DEVICE_NOTES = {
    "tied_embedding_sum": "词嵌入与输出层共享权重时，两份梯度在模拟设备上异地相加（多一份 V·h）",
    "softmax_upcast": "16 位注意力分数上的 FP32 softmax：CPU 先把分数转成 FP32，反向多一份 FP32 梯度",
}


def estimate(w: Workload, qlora: bool | None = None, device: str = "cuda") -> Estimate:
    """Peak allocated bytes of one steady-state step of `w` on one device, with a breakdown.

    `qlora=True` is `w` with `qlora=True` (kept for older callers): the base's Linear weights in
    NF4 (Dettmers et al. 2023), every other parameter fp32 (peft's prepare_model_for_kbit_training).
    `device="sim"`: as vramlab's simulated device allocates (see SIM_DEVICE_NOTES), for checking.
    """
    if qlora:
        w = replace(w, qlora=True)
    w.validate()
    if w.inference:
        return estimate_inference(w.model, w.batch, w.seq, w.compute_dtype_name, kv_cache=False,
                                  attention=w.attention, _workload=w)
    p = get_preset(w.model)
    if w.qlora and p.family == "mixtral":
        raise WorkloadError("Mixtral 的专家权重是 3 维参数，不是 nn.Linear：bitsandbytes 不会把它们量化成 4 位，"
                            "而 prepare_model_for_kbit_training 会把它们升为 FP32。vramlab 不估算 MoE 的 QLoRA")
    params = param_count(p)
    lora = w.lora_rank > 0
    shapes = trainable_shapes(p, w)
    trainable = sum(_numel(s) for s in shapes)
    n_dev = w.gpus if w.zero else 1
    pb = 4 if (w.precision == "fp32" or w.mixed or w.qlora) else 2     # a non-4-bit parameter
    notes: dict[str, str] = {}

    # --- weights, gradients, optimizer state (persistent) ---------------------------------------
    if w.qlora:
        q = quantized_shapes(p)
        nq = sum(i * o for i, o in q)
        base_w = sum(nf4_bytes(i * o) for i, o in q) + (params - nq) * 4
        notes["parameters"] = (f"QLoRA：{nq:,} 个线性层权重用 NF4 存储（4 bit + 双重量化常数 ≈ 0.516 字节/参数）；"
                               f"其余 {params - nq:,} 个参数被 prepare_model_for_kbit_training 升为 FP32（4 字节）；")
    else:
        base_w = params * pb
        notes["parameters"] = f"{params:,} 个参数 × {pb} 字节（{w.param_dtype_name}）；"
    if lora:   # adapters: fp32 (peft upcasts adapter weights), trained with fp32 grads and state
        weights, w_bytes, g_bytes, s_bytes = base_w + trainable * 4, 4, 4, 4
        notes["parameters"] += f"LoRA 适配器 {trainable:,} 个参数 × 4 字节（peft 默认把适配器升为 fp32）；"
    elif w.zero and w.mixed:   # DeepSpeed-style: 16-bit weights/grads, fp32 master copy in the optimizer
        weights, w_bytes, g_bytes, s_bytes = params * 2, 2, 2, 4
    else:
        weights, w_bytes, g_bytes, s_bytes = base_w, pb, pb, pb
    grads = trainable * g_bytes
    state = optimizer_state_bytes(w.optimizer, trainable, s_bytes, shapes=shapes)
    if w.zero and w.mixed and not lora:
        state += params * 4   # fp32 master weights: ZeRO's K = 12 = 4 (master) + 8 (Adam)
    # ZeRO sharding (Rajbhandari et al. 2020): stage 1 state, 2 + grads, 3 + weights
    if w.zero >= 1:
        state //= n_dev
    if w.zero >= 2:
        grads //= n_dev
    if w.zero >= 3:
        weights //= n_dev

    # --- activations, autocast's weight copies, logits -------------------------------------------
    sim = device == "sim"
    acts = _activations(w, p, sim)
    fw = acts["forward"]
    act = acts["total"]
    # autocast caches a 16-bit copy of every fp32 weight that requires grad (full fine-tuning: all
    # matmul weights; LoRA: the adapters) until the outermost autocast exits; frozen weights are
    # cast anew at each use and their copies live only while a matmul has saved them
    cache = 0
    if w.mixed and not w.zero:
        cache = matmul_weight_params(p) * 2 if not lora else trainable * 2
    cached_bwd = acts["cached"] if not w.zero else 0
    casts = acts["casts"]
    lg = logits_bytes(w, p, fw["logits_bytes_per_elem"])
    ws = 2 * CUBLAS_WORKSPACE_BYTES
    grads_now = grads if w.accum > 1 else 0   # set_to_none=True: grads are freed after each step
    tied = p.family in ("gpt2", "bert") or bool(p.config.get("tie_word_embeddings"))
    emb_grad = p.vocab * p.hidden * g_bytes // (n_dev if w.zero >= 2 else 1) if not lora else 0

    # the last block's backward (the first block backward runs) and block 0's at the end: every
    # other block's activations, and the block's own saved tensors (recomputed when checkpointed)
    # with the gradients in flight, from `_backward_peak` over the block without checkpointing
    ckpt, off = w.checkpointing, w.offload == "activations"
    full = fw if ckpt == "none" else _forward(replace(w, checkpointing="none"), p, recompute=ckpt, sim=sim)
    # the last block's own share of `act` (under save_on_cpu nothing is on the device)
    if ckpt == "full":
        own_rest = 0 if off else fw["block_input"]
    else:
        own_rest = (fw["rest_kept"] if _kwarg_checkpoint_input(w, p) else 0) if off else fw["rest"] + fw["rest_kept"]
    ws_rest, ws_first = full["rest_ws"], full["first_ws"]
    if ckpt == "full":
        # the checkpoint's input (one storage with what the recomputation saves of it), and the
        # recomputation's forward (whose walk holds that input) with the output's gradient waiting
        ws_rest = max(ws_rest + (0 if full["rest_saves_input"] else fw["block_input"]),
                      full["rest_fwd_rc"] + fw["out_bytes"])
        ws_first = max(ws_first + (0 if full["first_saves_input"] else fw["block_input"]),
                       full["first_fwd_rc"] + fw["out_bytes"])
    elif ckpt == "selective":
        ws_rest, ws_first = ws_rest + fw["rest_kept"], ws_first + fw["first_kept"]
    # the last block's forward: the blocks before it saved, and it running (not checkpointed): its
    # saved tensors so far, its locals, the running op and the weight copies made so far (under
    # save_on_cpu the saved tensors, and the frozen weights' copies saved with them, are on the host)
    fwd_last = 0 if ckpt == "full" else (fw["rest_fwd"] if not off else fw["rest_fwd_off"])
    # the weight copies the last block (part of fwd_last) and the LM head have not made yet
    not_yet = 0 if ckpt == "full" else fw["rest_wcache"] + (0 if off else fw["rest_wsave"])
    not_yet += (fw["head_cached"] if not w.zero else 0) + (0 if off else fw["head_casts"])
    leaf = fw["leaf"]
    # eager attention's additive causal mask, [B, 1, S, S] in the embeddings' dtype (transformers'
    # create_causal_mask; BERT attends both ways and builds none): the model keeps it while the
    # blocks run, and a checkpoint (it is a keyword argument of the checkpointed call) until the
    # last recomputation
    mask = w.batch * w.seq * w.seq * pb if (w.attention == "eager" and p.family != "bert") else 0
    kept_mask = mask if ckpt != "none" else 0
    # at the end only the embeddings' saved tensors are left besides block 0's
    emb_saved = 0 if off else fw["emb"]
    # the LM head's saved weight copy is freed once its node ran; the last block's copies are part
    # of its backward walk (freed node by node)
    head_copies = 0 if off else fw["head_casts"] + (fw["head_cached"] if not w.zero else 0)
    rest_copies = 0 if (off or ckpt == "full") else fw["rest_casts"] + (fw["rest_cached"] if not (w.zero or lora) else 0)

    # --- optimizer temporaries, ZeRO-3 gathers, QLoRA dequantisation ---------------------------
    temp_opt = _optimizer_temp_bytes(w, p, shapes, s_bytes) // (n_dev if w.zero else 1)
    zero3_gather = 2 * block_params(p) * w_bytes if w.zero == 3 else 0   # current + prefetched layer
    dequant = (max(i * o for i, o in quantized_shapes(p)) * DTYPE_BYTES[w.compute_dtype_name]) if w.qlora else 0

    head_grad_now = 0 if lora else p.vocab * p.hidden * g_bytes
    # save_on_cpu packs every saved tensor, parameters included: the head's backward brings its
    # weight (the 16-bit copy under autocast) and its input back to the device
    head_unpack = 0
    if w.offload == "activations":
        head_unpack = p.vocab * p.hidden * (2 if w.mixed else pb) + w.batch * w.seq * p.hidden * pb
    phases = {
        "block_forward": dict(parameters=weights + cache + casts - not_yet, gradients=grads_now,
                              optimizer_state=state,
                              activations=act - own_rest - (0 if off else fw["head"]) + fw["model_held"] + leaf + mask,
                              logits_and_loss=0, temporaries=zero3_gather + fwd_last, cuda_overhead=ws),
        "forward_end": dict(parameters=weights + cache + casts, gradients=grads_now, optimizer_state=state,
                            activations=act + leaf + kept_mask, logits_and_loss=lg["forward_end"],
                            temporaries=zero3_gather,
                            cuda_overhead=ws),
        "backward_start": dict(parameters=weights + cached_bwd + casts, gradients=grads_now,
                               optimizer_state=state, activations=act + leaf + kept_mask,
                               logits_and_loss=lg["backward_start"],
                               temporaries=zero3_gather, cuda_overhead=ws),
        # the LM head's backward: the logits' gradient (in the logits' dtype) and the head's weight gradient
        "head_backward": dict(parameters=weights + cached_bwd + casts, gradients=grads_now + head_grad_now,
                              optimizer_state=state, activations=act + leaf + kept_mask,
                              logits_and_loss=w.batch * w.seq * (p.vocab * fw["logits_bytes_per_elem"] + 8) + head_unpack,
                              temporaries=zero3_gather, cuda_overhead=ws),
        "block_backward": dict(parameters=weights + cached_bwd + casts - head_copies - rest_copies,
                               gradients=grads_now + head_grad_now, optimizer_state=state,
                               activations=act - own_rest - (0 if off else fw["head"]) + leaf + kept_mask,
                               logits_and_loss=0,
                               temporaries=zero3_gather + ws_rest, cuda_overhead=ws),
        "backward_end": dict(parameters=weights,
                             gradients=grads - full["first_grads"] - (0 if tied or w.accum > 1 else emb_grad),
                             optimizer_state=state, activations=emb_saved + leaf + kept_mask, logits_and_loss=0,
                             temporaries=zero3_gather + ws_first, cuda_overhead=ws),
        "optimizer_step": dict(parameters=weights, gradients=grads, optimizer_state=state, activations=0,
                               logits_and_loss=0, temporaries=temp_opt, cuda_overhead=ws),
    }
    # the embedding's backward (full fine-tuning): its new gradient is a separate tensor until
    # AccumulateGrad adds it to an existing .grad (accumulation); a tied LM head's gradient waits
    # in the autograd engine's input buffer to be summed with it (in place on CUDA:
    # torch/csrc/autograd/input_buffer.cpp, accumulate)
    extra = (emb_grad if tied else 0) + (emb_grad if w.accum > 1 else 0)
    if device == "sim" and tied:
        extra += emb_grad
    if extra:
        phases["embedding_backward"] = dict(parameters=weights, gradients=grads, optimizer_state=state,
                                            activations=0, logits_and_loss=0, temporaries=extra, cuda_overhead=ws)
    totals = {k: sum(v.values()) for k, v in phases.items()}
    peak = max(phases, key=lambda k: totals[k])
    breakdown = {k: int(phases[peak][k]) for k in KEYS}

    notes["parameters"] += _param_note(w, cache, cached_bwd + casts, peak, n_dev)
    notes["gradients"] = _grad_note(w, trainable, g_bytes, peak, n_dev)
    notes["optimizer_state"] = _state_note(w, trainable, s_bytes, n_dev)
    notes["activations"] = _act_note(w, p, act, peak)
    notes["logits_and_loss"] = (f"logits 与 loss：N·V = {w.batch * w.seq:,} × {p.vocab:,}。HF 先把 logits 升为 fp32"
                                f"（logits.float()），前向末尾有 logits + fp32 副本 + log_softmax 输出；反向开始时有 "
                                f"log_softmax 输出、nll_loss 的梯度和 log_softmax 的梯度 = 3 × N·V × 4 字节"
                                f"（{_mib(lg['backward_start'])}）。")
    notes["temporaries"] = _temp_note(w, temp_opt, zero3_gather, dequant, extra, peak)
    notes["cuda_overhead"] = ("cuBLAS 工作区由 PyTorch 缓存分配器分配，计入 max_memory_allocated：Hopper（sm90）默认 "
                              "CUBLAS_WORKSPACE_CONFIG=:4096:8 = 32 MiB（见 ATen/cuda/CublasHandlePool.cpp）；"
                              "反向在 autograd 自己的线程上跑、用另一个 cuBLAS 句柄，所以训练时有 2 份 = 64 MiB。"
                              "CUDA 上下文本身（约 600–700 MiB）不在分配器里，不计入。")
    notes["peak"] = f"峰值时刻：{_PHASE_ZH[peak]}（各时刻估计：" + "，".join(
        f"{_PHASE_ZH[k]} {_mib(v)}" for k, v in totals.items()) + "）"
    return Estimate(w, int(totals[peak]), breakdown, notes, params, trainable, peak, totals)


_PHASE_ZH = {"block_forward": "最后一层前向", "forward_end": "前向末尾", "backward_start": "反向开始", "head_backward": "输出层反向",
             "block_backward": "最后一层反向",
             "backward_end": "反向末尾", "embedding_backward": "词嵌入反向", "optimizer_step": "优化器 step",
             "prefill": "前向（prefill）"}
PHASE_ZH = _PHASE_ZH     # every value Estimate.peak_phase / the keys of Estimate.phases can take, in Chinese


def _optimizer_temp_bytes(w: Workload, p: Preset, shapes: list, s_bytes: int) -> int:
    """Extra memory while optimizer.step() runs.

    - foreach AdamW (PyTorch's default on GPU, torch/optim/adamw.py `_multi_tensor_adamw`) computes
      `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` for all parameters at once: one full copy.
      The for-loop variant (foreach=False) builds `exp_avg_sq.sqrt() / bias_correction2_sqrt` per
      parameter (two temporaries) while the previous parameter's `denom` is still bound.
    - foreach Adafactor (torch/optim/_adafactor.py `_multi_tensor_adafactor`) builds the variance
      estimate `row_var @ col_var` of every matrix at once and keeps it (as `updates`) while it
      processes the vectors: one full copy of the trainable parameters. The for-loop variant holds
      one parameter-sized estimate, and the previous parameter's until the name is rebound.
    - SGD(+momentum) and bitsandbytes' 8-bit AdamW update in place.
    """
    if w.optimizer in ("sgd", "sgdm", "adamw8bit"):
        return 0
    n = [_numel(s) for s in shapes]
    if w.foreach:
        return sum(n) * s_bytes
    # for-loop: the previous parameter's `denom` / `update` lives until the name is rebound
    k = 2 if w.optimizer == "adamw" else 1
    return max(k * n[i] + (n[i - 1] if i else 0) for i in range(len(n))) * s_bytes


def _param_note(w, cache, saved_casts, peak, n_dev):
    s = ""
    if cache:
        what = "矩阵乘权重" if not w.lora_rank else "LoRA 适配器"
        s += (f"autocast 只缓存需要梯度的 fp32 叶子张量的 16 位副本（{what} × 2 字节 = {_mib(cache)}），到退出 autocast 为止"
              f"（ATen autocast_mode.cpp 的 cached_cast）。")
    if w.mixed and w.lora_rank and not w.qlora:
        s += "冻结的基座权重不缓存：每次使用都重新转换，只有被 matmul 为反向保存的副本留着。"
    if saved_casts:
        s += f"反向开始时仍被保存的 16 位权重副本：{_mib(saved_casts)}。"
    if w.zero >= 3:
        s += f"ZeRO-3：权重按 {n_dev} 卡分片，每卡 1/{n_dev}。"
    return s


def _grad_note(w, trainable, g_bytes, peak, n_dev):
    s = f"{trainable:,} 个可训练参数 × {g_bytes} 字节。"
    if w.lora_rank:
        s += "LoRA：冻结的基座权重没有梯度。"
    if w.accum > 1:
        s += f"梯度累积 {w.accum} 步：梯度在各 micro-step 之间一直存在。"
    else:
        s += "zero_grad(set_to_none=True) 后梯度被释放，所以反向开始时为 0，优化器 step 时才全部存在。"
    if w.zero >= 2:
        s += f"ZeRO-2/3：梯度按 {n_dev} 卡分片。"
    return s


def _state_note(w, trainable, s_bytes, n_dev):
    per = {"sgd": "SGD：没有状态 = 0 字节/参数",
           "sgdm": f"SGD+动量：每个参数 1 个动量缓冲 = {s_bytes} 字节/参数",
           "adamw": f"AdamW：每个参数 2 个状态（m、v）= {2 * s_bytes} 字节/参数",
           "adamw8bit": ("8-bit AdamW（Dettmers 2022；bitsandbytes 0.50）：m、v 各 1 字节 + 每 256 个值一个 fp32 量化常数"
                         " ≈ 2.03 字节/参数；少于 4096 个元素的张量保留两个 fp32 状态（8 字节/参数）"),
           "adafactor": "Adafactor（Shazeer & Stern 2018）：矩阵的二阶矩分解为行向量 + 列向量（r + c 而不是 r·c），没有一阶矩"}
    s = per[w.optimizer] + f"；可训练参数 {trainable:,} 个。"
    if w.zero and w.mixed and not w.lora_rank:
        s += "ZeRO + 混合精度：另有 fp32 主权重 4 字节/参数（论文中 K = 12 = 4 + 8）。"
    if w.zero >= 1:
        s += f"ZeRO-{w.zero}：优化器状态按 {n_dev} 卡分片。"
    return s


def _act_note(w, p, act, peak):
    s = (f"autograd 为反向保存的张量（micro-batch {w.batch} × 序列 {w.seq}），按张量逐个累加（见 saved_per_block）；"
         f"参考公式 Korthikanti 2022：每层 sbh·(34 + 5as/h) 字节（16 位）。")
    if w.attention == "sdpa":
        s += "SDPA（FlashAttention / memory-efficient）不保存 s² 的注意力分数。"
    else:
        s += "eager 注意力保存 B·heads·S² 的 softmax 输出（有 dropout 时还有 1 字节掩码和 dropout 输出）。"
    if w.checkpointing == "full":
        s += "全量检查点：每层只保留输入 B·S·h，反向时一次重算一层。"
    elif w.checkpointing == "selective":
        s += ("选择性检查点（vramlab 的定义，与第 7 章教程相同）：每层的注意力模块（q/k/v/o 投影与注意力核心）"
              "只保留输入，反向时重算；MLP 照常保存。")
    if w.offload == "activations":
        s += "save_on_cpu：保存的张量（连同检查点为重算保存的输入）在主存里，反向时逐个取回；重算时保存的张量留在设备上。"
    if w.accum > 1:
        s += f"梯度累积：激活只与 micro-batch 有关，与累积步数 {w.accum} 无关。"
    if w.lora_rank:
        s += "LoRA：冻结层的输入不必保存（不需要它们的权重梯度），但梯度仍要流过所有层。"
        if w.checkpointing == "full":
            s += ("全量检查点 + LoRA：transformers 的 gradient_checkpointing_enable() 会调用 enable_input_require_grads()，"
                  "词嵌入的输出因此需要梯度，成了叶子张量，由它的 AccumulateGrad 节点一直持有到计算图释放；第一层也像其它层一样"
                  "为反向保存张量。")
    if w.attention == "eager" and p.family != "bert":
        s += ("eager 注意力还有一个因果掩码 B·S² ×（词嵌入的精度）（transformers 的 create_causal_mask）：前向期间一直存在，"
              "用检查点时作为关键字参数被检查点留到最后一次重算。")
    if w.qlora:
        s += "QLoRA：非量化参数是 FP32，4 位层把输出转回输入的精度，所以残差流和大部分激活值是 FP32。"
    return s


def _temp_note(w, temp_opt, gather, dequant, emb_extra, peak):
    s = ""
    if w.optimizer in ("adamw", "adafactor") and w.foreach:
        what = "sqrt(v)" if w.optimizer == "adamw" else "row_var @ col_var 的方差估计"
        s += f"foreach {w.optimizer} 一次为全部参数算 {what}：临时多一份参数大小（{_mib(temp_opt)}），只在 step 时出现。"
    elif temp_opt:
        s += f"优化器逐个参数计算，临时缓冲按最大的参数张量计（{_mib(temp_opt)}）。"
    else:
        s += "优化器原地更新，没有大的临时张量。"
    if emb_extra:
        s += (f"词嵌入反向：新算出的词嵌入梯度在加进已有梯度（梯度累积）或与共享权重的输出层梯度相加之前是单独的张量"
              f"（{_mib(emb_extra)}）。")
    if gather:
        s += f"ZeRO-3：当前层与预取层的完整权重（{_mib(gather)}）。"
    if dequant:
        s += f"QLoRA：每次矩阵乘前把一层 NF4 权重反量化为计算精度（{_mib(dequant)}）。"
    if peak == "block_forward" or (peak == "block_backward" and w.checkpointing != "none"):
        s += ("一层的前向（或反向时的重算）里，除了 autograd 保存的张量，还有各模块的 Python 局部变量引用着的张量："
              "层的输入与残差、归一化的输出、注意力的 q/k/v、peft 把输入转成 FP32 的副本、正在计算的算子的输入和输出。")
    return s


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------

def kv_cache_bytes(model: str | Preset, batch: int, seq: int, dtype: str = "bf16") -> int:
    """KV cache = 2 (K and V) · layers · batch · seq · kv_heads · head_dim · bytes.

    With grouped-query attention (Ainslie et al. 2023) kv_heads < heads shrinks it proportionally.
    """
    p = get_preset(model) if isinstance(model, str) else model
    return 2 * p.n_layers * batch * seq * p.kv_heads * _head_dim(p) * DTYPE_BYTES[dtype]


def estimate_inference(model: str, batch: int, seq: int, dtype: str = "bf16", kv_cache: bool = True,
                       attention: str = "sdpa", _workload: Workload | None = None) -> Estimate:
    """Peak of one forward pass under torch.inference_mode (nothing is saved for backward).

    kv_cache=False: a plain forward returning logits for every position (B·S·V in `dtype`).
    kv_cache=True: generation's prefill: the cache for all `seq` positions, logits only for the last
    position (HF generate passes logits_to_keep=1) and upcast to fp32.
    Working set inside a block: the residual, the block input and the widest MLP intermediates
    (GPT-2's Python gelu_new keeps ~4 B·S·4h tensors alive at once; SwiGLU ~3; GeLU 2), plus with
    eager attention the B·heads·S² scores and their softmax.
    """
    if dtype not in DTYPE_BYTES:
        raise WorkloadError(f"dtype 只能是 {', '.join(DTYPE_BYTES)}，收到 {dtype!r}")
    w = _workload or Workload(model=model, batch=batch, seq=seq, attention=attention, inference=True,
                              precision="fp32" if dtype == "fp32" else dtype).validate()
    p = get_preset(model)
    b = DTYPE_BYTES[dtype]
    params = param_count(p)
    n, h, f = batch * seq, p.hidden, p.ffn_hidden
    weight_b = 4 if (w.mixed or w.precision == "fp32") else b
    cache = matmul_weight_params(p) * 2 if w.mixed else 0
    kv = kv_cache_bytes(p, batch, seq, dtype) if kv_cache else 0
    widest = {"gpt2": 4, "bert": 2, "llama": 3, "mixtral": 3}[p.family]
    k_ = p.config.get("num_experts_per_tok", 1)
    block_ws = n * (2 * h + widest * f * k_) * b
    if attention == "eager":
        block_ws = max(block_ws, n * 2 * h * b + 2 * batch * p.heads * seq * seq * b)
    if kv_cache:
        logits = batch * p.vocab * (b + 4)
    else:
        logits = n * p.vocab * b + n * h * b
    # the block working set and the logits are never alive at the same time: keep the larger
    in_block = block_ws > logits
    breakdown = dict(parameters=params * weight_b + cache, gradients=0, optimizer_state=0, activations=kv,
                     logits_and_loss=0 if in_block else logits, temporaries=block_ws if in_block else 0,
                     cuda_overhead=CUBLAS_WORKSPACE_BYTES)
    breakdown = {k: int(breakdown[k]) for k in KEYS}
    notes = {
        "parameters": f"{params:,} 个参数 × {weight_b} 字节" + ("；另有 autocast 缓存的 16 位权重副本" if cache else ""),
        "gradients": "推理：没有梯度。", "optimizer_state": "推理：没有优化器状态。",
        "activations": ("KV cache = 2 · 层数 · batch · seq · kv_heads · head_dim · 字节 = " + _mib(kv)) if kv_cache
        else "inference_mode：不为反向保存任何张量；不用 KV cache 时这里为 0。",
        "logits_and_loss": ("只算最后一个位置的 logits（B·V），并升为 fp32" if kv_cache
                            else f"全部位置的 logits：B·S·V × {b} 字节 = {_mib(n * p.vocab * b)}"),
        "temporaries": f"块内工作集（残差 + 最宽的 MLP 中间结果）≈ {_mib(block_ws)}，与 logits 不同时存在，取较大者。",
        "cuda_overhead": "1 份 cuBLAS 工作区：Hopper 上 32 MiB（CUBLAS_WORKSPACE_CONFIG 默认 :4096:8）；推理没有 autograd 线程。",
    }
    total = sum(breakdown.values())
    notes["peak"] = f"峰值时刻：{_PHASE_ZH['prefill']}"
    return Estimate(w, int(total), breakdown, notes, params, 0, "prefill", {"prefill": int(total)})


# ---------------------------------------------------------------------------------------------
# Reference table (vramlab/data/h200_gpt2_peaks.md)
# ---------------------------------------------------------------------------------------------

def comparison_table() -> list[tuple[str, float, float, float]]:
    """(row, reference MiB, estimate MiB, estimate/reference) for the H200 reference table."""
    from .reference import reference_rows
    from .workload import from_reference_name

    out = []
    for row in reference_rows():
        est = estimate(from_reference_name(row.name)).total_bytes / MiB
        out.append((row.name, row.steady_mib, est, est / row.steady_mib))
    return out


if __name__ == "__main__":
    print(f"{'row':45s} {'ref MiB':>9s} {'est MiB':>9s} {'ratio':>6s}")
    for name, ref, est, ratio in comparison_table():
        print(f"{name:45s} {ref:9.0f} {est:9.0f} {ratio:6.3f}")
