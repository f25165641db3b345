"""Analytic peak-memory estimate of one training (or inference) step, with a breakdown.

No torch needed: every figure is a closed-form count of the tensors that PyTorch keeps on the device,
so the same formulas can be ported to the JavaScript calculator. The estimate is of
`torch.cuda.max_memory_allocated()` on ONE device in the steady state (optimizer state exists),
for Hugging Face transformers models with `labels=input_ids`.

How it works. Memory at any instant = what persists between steps (weights, optimizer state, and
gradients while they exist) + what autograd saved for backward + short-lived buffers. The peak is
the largest of four instants (`PHASES`), each a plain sum:

    forward_end     end of the forward pass: all saved activations + logits, fp32 logits copy and
                    log-softmax output (+ under autocast, the cache of 16-bit weight copies)
    backward_start  first backward op: saved activations + log-softmax output + its gradient +
                    the logits gradient (three B*S*V fp32 tensors: usually THE peak of LM training)
    backward_end    all gradients exist, one block's activations (or a recomputed block) remain
    optimizer_step  weights + grads + state + the optimizer's temporaries (foreach AdamW builds a
                    full-size sqrt(v) buffer)

Which tensors a block saves was read off HF GPT-2 with `torch.autograd.graph.saved_tensors_hooks`
and checked against real H200 measurements (vramlab/data/h200_gpt2_peaks.md, every row within a
few percent; run `python -m vramlab.estimate` for the table). Sources for each formula are cited in
the function that computes it.

QLoRA: the Workload has no quantization field, so `estimate(w, qlora=True)` (with `w.lora_rank > 0`)
means "the frozen base linear weights are NF4"; see `qlora_weight_bytes`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .models import Preset, get_preset
from .workload import Workload, WorkloadError

MiB = 1024**2
KEYS = ("parameters", "gradients", "optimizer_state", "activations", "logits_and_loss", "temporaries",
        "cuda_overhead")
PHASES = ("forward_end", "backward_start", "backward_end", "optimizer_step")
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


def lora_params(model: str | Preset, rank: int) -> int:
    """LoRA adapter size (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"):
    each adapted d_in x d_out weight gains A (r x d_in) and B (d_out x r): r·(d_in + d_out) params.

    Targets are peft's defaults per family (GPT-2: c_attn, so r=8 on GPT-2 small gives
    12 · 8 · (768 + 2304) = 294,912 trainable parameters).
    """
    p = get_preset(model) if isinstance(model, str) else model
    shapes = linear_shapes(p)
    return p.n_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in LORA_TARGETS[p.family])


def qlora_weight_bytes(n_params: int) -> float:
    """NF4 storage (Dettmers et al. 2023, "QLoRA", Sec. 3): 4 bits per weight, one absmax per
    64-weight block, itself quantized to 8 bits with an fp32 constant per 256 blocks (double
    quantization): 0.5 + 1/64 + 4/(64·256) ≈ 0.516 bytes per parameter (4.127 bits).
    """
    return n_params * (0.5 + 1 / 64 + 4 / (64 * 256))


# ---------------------------------------------------------------------------------------------
# Model states: weights, gradients, optimizer state
# ---------------------------------------------------------------------------------------------

def optimizer_state_bytes(optimizer: str, n_params: int, state_bytes: int, factored_elements: int | None = None) -> int:
    """Bytes of optimizer state for `n_params` trainable parameters stored at `state_bytes` each.

    - SGD: none. SGD + momentum: 1 buffer per parameter.
    - AdamW (Loshchilov & Hutter 2019): 2 buffers, m and v (PyTorch keeps them in the param dtype).
    - 8-bit AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"): m and v as
      uint8 = 2 bytes/param, plus one fp32 absmax per 2048-value block per state (bitsandbytes
      default block size), i.e. 2 + 2·4/2048 bytes/param.
    - Adafactor (Shazeer & Stern 2018): the second moment of an r x c matrix is factored into a row
      vector (r) and a column vector (c); vectors (biases, norms) keep a full second moment. No first
      moment (torch.optim.Adafactor, beta1=None). `factored_elements` = Σ(r + c) over matrices
      + the size of every vector (see `adafactor_factored_elements`); default: as if one square matrix.
    """
    if optimizer == "sgd":
        return 0
    if optimizer == "sgdm":
        return n_params * state_bytes
    if optimizer == "adamw":
        return 2 * n_params * state_bytes
    if optimizer == "adamw8bit":
        return int(n_params * (2 + 2 * 4 / 2048))
    if optimizer == "adafactor":
        if factored_elements is None:
            factored_elements = 2 * math.isqrt(n_params)
        return factored_elements * state_bytes
    raise WorkloadError(f"未知优化器 {optimizer!r}")


def adafactor_factored_elements(p: Preset, lora_rank: int = 0) -> int:
    """Adafactor's second-moment size: rows + columns of every matrix, full size for vectors."""
    h = p.hidden
    if lora_rank:   # each adapted weight has A (r x d_in) and B (d_out x r)
        return p.n_layers * sum(2 * lora_rank + linear_shapes(p)[t][0] + linear_shapes(p)[t][1]
                                for t in LORA_TARGETS[p.family])
    rows_cols = sum(i + o + (o if b else 0) for i, o, b in linear_shapes(p).values())
    if p.family == "mixtral":   # experts stored as 3-D tensors: factor the last two dims per expert
        rows_cols += p.config["num_local_experts"] * 3 * (h + p.ffn_hidden)
    per_block = rows_cols + (2 * h if p.family in ("llama", "mixtral") else 4 * h)
    embeddings = p.vocab + h + (p.config.get("n_positions", p.config.get("max_position_embeddings", 0)) + h
                                if p.family in ("gpt2", "bert") else 0)
    return p.n_layers * per_block + embeddings + 2 * h


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


@dataclass(frozen=True)
class _Bytes:
    """Bytes per element by role, for a precision mode.

    param/state: weights and optimizer state. act: matmul inputs/outputs (what autocast lowers).
    res: residual stream and LayerNorm inputs. f32op: outputs of ops autocast keeps in fp32
    (pow, tanh, softmax, layer_norm...; see torch.amp docs "CUDA Ops that can autocast to float32").
    lora_in: the input saved by a LoRA A matrix (peft upcasts adapters to fp32 and casts x to them).
    """
    param: int
    act: int
    res: int
    f32op: int
    lora_in: int


def _bytes_of(w: Workload) -> _Bytes:
    if w.precision == "fp32":
        return _Bytes(4, 4, 4, 4, 4)
    if w.mixed:      # fp32 weights, 16-bit matmuls, fp32 residual stream (16-bit + fp32 -> fp32)
        return _Bytes(4, 2, 4, 4, 2)
    return _Bytes(2, 2, 2, 2, 4)   # pure 16-bit


# ---------------------------------------------------------------------------------------------
# Activations: what autograd saves, per tensor
# ---------------------------------------------------------------------------------------------

def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, selective: bool = False) -> int:
    """Activation bytes per transformer layer in 16-bit, with dropout, no parallelism
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Eq. 1):

        s·b·h·(34 + 5·a·s/h)

    34·sbh = attention 11 (QKV input 2, Q and K 4, V 2, out-proj input 2, dropout mask 1)
           + MLP 19 (input 2, GeLU input 8, GeLU output 8, dropout mask 1) + two LayerNorm inputs 4.
    5·a·s²·b: the attention score softmax output (2), its dropout mask (1) and dropout output (2).
    Selective recomputation (their Sec. 4.2) recomputes the attention core and keeps only 34·sbh.
    """
    return s * b * h * 34 if selective else s * b * h * 34 + 5 * a * s * s * b


def _saved_attention(w: Workload, p: Preset, d: _Bytes, n: int, o_trainable: bool) -> list[tuple[str, int]]:
    """Tensors the attention core saves, for N = B·S tokens.

    SDPA on CUDA (FlashAttention, Dao et al. 2022; or the memory-efficient kernel for fp32) saves
    only q, k, v, the output and an fp32 logsumexp [B, heads, S rounded up to 32]: no s² scores,
    and attention dropout is regenerated from the RNG seed, so no mask either.
    Eager attention materialises the B·heads·S² scores: the softmax output is saved (fp32 under
    autocast, plus the 16-bit copy the next matmul saves), and with dropout a 1-byte bool mask and
    the dropout output too. q, k, v are copied by matmul (the head-transposed views can't be
    reshaped to 3-D), so eager also stores 3 q/k/v-sized tensors and a contiguous copy of the output.
    """
    hd, b, s = _head_dim(p), w.batch, w.seq
    q, kv = p.heads * hd, p.kv_heads * hd
    qkv = (q + 2 * kv) * n * d.act
    if w.attention == "sdpa":
        return [("q,k,v", qkv), ("attn_out", n * q * d.act), ("logsumexp", b * p.heads * math.ceil(s / 32) * 32 * 4)]
    out = [("q,k,v (matmul copies)", (q + 2 * q) * n * d.act if p.family in ("llama", "mixtral") else qkv)]
    if w.checkpointing != "selective":   # selective recomputation drops exactly the s² tensors
        scores = b * p.heads * s * s
        out.append(("softmax(scores)", scores * d.f32op))
        if w.mixed:
            out.append(("softmax 16-bit copy", scores * d.act))
        if w.dropout > 0:
            out += [("attn dropout mask", scores), ("attn dropout out", scores * d.act)]
    if o_trainable:
        out.append(("attn_out (contiguous)", n * q * d.act))
    return out


def saved_per_block(w: Workload, p: Preset | None = None, first: bool = False,
                    fused_gelu: bool = False) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor autograd saves for one block, without checkpointing.

    Rules (PyTorch saves an input only if the gradient that needs it is required):
    - a LayerNorm saves its input (+ per-token mean/rstd); a Linear saves its input only if its weight
      trains, and its weight (already counted as a parameter) if its input needs a gradient;
    - elementwise x*y saves both operands, x*scalar and x+y save nothing; tanh saves its output;
    - dropout with p > 0 saves a 1-byte bool mask on CUDA; p = 0 returns its input unchanged.
    HF GPT-2's `gelu_new` is written out in Python (0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³)))), so
    it saves x³'s input, tanh's output, (1 + tanh) and 0.5·x: 4 tensors of B·S·4h, not 1 (`fused_gelu`
    models a single-kernel GeLU; with fp16, dropout and eager attention that gives Korthikanti's
    34·sbh + 5·as²b exactly).
    """
    p = p or get_preset(w.model)
    d, n, h, f = _bytes_of(w), w.batch * w.seq, p.hidden, p.ffn_hidden
    lora = w.lora_rank > 0
    train = not lora                        # base weights train (full fine-tuning)
    drop = w.dropout > 0
    stats = 2 * n * 4                       # LayerNorm/RMSNorm mean and rstd (fp32, per token)
    saved: list[tuple[str, int]] = []
    if not (lora and first):                # block 0 under LoRA: nothing upstream needs a gradient
        saved += [("norm1 input", n * h * d.res), ("norm1 stats", stats)]
    if p.family == "bert":
        return _saved_bert_block(w, p, d, n, train, drop, saved)
    if p.family in ("llama", "mixtral"):
        return _saved_llama_block(w, p, d, n, train, saved)
    # GPT-2
    if train:
        saved.append(("c_attn input", n * h * d.act))
    else:
        saved.append(("lora_A input", n * h * d.lora_in))
    saved += _saved_attention(w, p, d, n, o_trainable=train)
    if drop:
        saved.append(("resid dropout mask", n * h))
    saved += [("norm2 input", n * h * d.res), ("norm2 stats", stats)]
    if train:
        saved.append(("c_fc input", n * h * d.act))
    if fused_gelu:
        saved.append(("gelu input", n * f * d.act))
    else:  # pow input (fp32 under autocast), tanh out, 1 + tanh, 0.5·x (same dtype as c_fc output)
        saved += [("gelu: x for x³", n * f * d.f32op), ("gelu: tanh", n * f * d.f32op),
                  ("gelu: 1+tanh", n * f * d.f32op), ("gelu: 0.5·x", n * f * d.act)]
    if train:
        saved.append(("mlp c_proj input", n * f * d.act))
    if drop:
        saved.append(("mlp dropout mask", n * h))
    return saved


def _saved_bert_block(w, p, d, n, train, drop, saved):
    """Post-LN BERT block: LayerNorm(x + Attn(x)), LayerNorm(y + FFN(y)); GeLU is F.gelu (saves its input)."""
    h, f = p.hidden, p.ffn_hidden
    saved = [(k, v) for k, v in saved if k != "norm1 input"]   # post-LN: the block input is an LN output
    if train:   # q, k, v Linears share the input; under autocast each casts its own 16-bit copy
        saved.append(("q/k/v input", n * h * (3 * d.act if w.mixed else d.res)))
    else:
        # the frozen q/k/v Linears keep only their weights; the LoRA A matrices keep x, which peft
        # casts to the fp32 adapter in each adapted layer (query, value): one copy per target,
        # unless x is fp32 already (then both keep x itself)
        copies = 1 if w.precision == "fp32" else len(LORA_TARGETS["bert"])
        saved.append(("lora_A inputs", copies * n * h * d.lora_in))
    saved += _saved_attention(w, p, d, n, o_trainable=train)
    if drop:
        saved.append(("attn out dropout mask", n * h))
    saved.append(("norm1 input", n * h * d.res))
    if train:
        saved.append(("ffn input", n * h * d.act))
    saved.append(("gelu input", n * f * d.act))
    if train:
        saved.append(("ffn out-proj input", n * f * d.act))
    if drop:
        saved.append(("ffn dropout mask", n * h))
    return saved + [("norm2 input", n * h * d.res), ("norm2 stats", 2 * n * 4)]


def _saved_llama_block(w, p, d, n, train, saved):
    """Pre-norm Llama block. HF LlamaRMSNorm runs in fp32: x.float() (saved by pow and mul), the
    normalised x (saved by the weight multiply) and its output (saved by the next Linear). RoPE
    multiplies by constant cos/sin, so it saves nothing big. SwiGLU saves gate (silu input), silu(gate),
    up and their product. Mixtral: each token runs top-k experts, so the MLP terms scale by k, plus the
    gathered expert inputs and outputs and the router logits (approximation of HF's expert loop).
    """
    h, f, hd = p.hidden, p.ffn_hidden, _head_dim(p)
    norm = [("rmsnorm x.float()", n * h * 4), ("rmsnorm normalised", n * h * d.res)]
    saved = [(k, v) for k, v in saved if k != "norm1 input"] + norm
    saved.append(("q/k/v input", n * h * d.act if train else n * h * d.lora_in))
    saved += _saved_attention(w, p, d, n, o_trainable=train)
    saved += [(k.replace("1", "2"), v) for k, v in norm] + [("norm2 stats", 2 * n * 4)]
    if train:
        saved.append(("mlp input", n * h * d.act))
    if p.family == "mixtral":
        k_, e = p.config["num_experts_per_tok"], p.config["num_local_experts"]
        saved += [("router logits", n * e * (d.act + 4)), ("expert inputs", k_ * n * h * d.act),
                  ("expert outputs", k_ * n * h * d.act)]
        n = n * k_
    saved += [("gate", n * f * d.act), ("silu(gate)", n * f * d.act), ("up", n * f * d.act)]
    if train:
        saved.append(("down input", n * f * d.act))
    return saved


def _saved_head(w: Workload, p: Preset, d: _Bytes) -> int:
    """Saved outside the blocks: final norm input, LM-head input, embedding dropout mask, BERT MLM transform."""
    n, h = w.batch * w.seq, p.hidden
    total = n * h * d.res + 2 * n * 4                  # final norm input + stats
    if w.lora_rank == 0:
        total += n * h * d.act                         # LM-head input (its weight trains)
    if w.dropout > 0 and p.family in ("gpt2", "bert"):
        total += n * h                                 # embedding dropout mask
    if p.family == "bert":
        total += n * h * (2 * d.act + d.res)           # transform dense input, gelu input, LayerNorm input
    return total


def activation_bytes(w: Workload, p: Preset | None = None) -> int:
    """Bytes of saved activations on the device at the end of the forward pass (one micro-batch).

    - none: every block's saved tensors (`saved_per_block`), plus the head's.
    - full checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; HF uses
      torch.utils.checkpoint, non-reentrant): only each block's input (B·S·h) is kept; one block is
      recomputed at a time in backward (counted in the backward_end phase).
    - selective (Korthikanti et al. 2022): keep everything except the s² attention tensors.
    - offload="activations" (torch.autograd.graph.save_on_cpu): saved tensors live in host memory,
      so nothing stays on the device; they come back one node at a time in backward.
    Gradient accumulation does not change this: only one micro-batch is in flight.
    """
    p = p or get_preset(w.model)
    if w.offload == "activations":
        return 0
    d = _bytes_of(w)
    if w.checkpointing == "full":
        blocks = p.n_layers * w.batch * w.seq * p.hidden * d.res
    else:
        first = sum(b for _, b in saved_per_block(w, p, first=True))
        rest = sum(b for _, b in saved_per_block(w, p))
        blocks = first + (p.n_layers - 1) * rest
    return blocks + _saved_head(w, p, d)


def logits_bytes(w: Workload, p: Preset | None = None) -> dict[str, int]:
    """The LM head and loss, the usual peak of LM training (N = B·S tokens, V = vocab).

    HF's ForCausalLMLoss upcasts: `logits.float()`, then cross_entropy = log_softmax + nll_loss.
      forward_end:    logits (16-bit or fp32) + its fp32 copy (absent when already fp32) + log_softmax
                      output (fp32, saved for backward)
      backward_start: log_softmax output + nll_loss's gradient + log_softmax's gradient: 3 fp32 N·V
    Plus the shifted int64 labels (8 bytes/token).
    """
    p = p or get_preset(w.model)
    d = _bytes_of(w)
    nv = w.batch * w.seq * p.vocab
    loss_b = 2 if (p.family == "bert" and w.param_dtype_name != "fp32") else 4   # BERT: no .float()
    labels = 8 * w.batch * w.seq
    fwd = nv * (d.act + (loss_b if d.act != loss_b else 0) + loss_b) + labels
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


def estimate(w: Workload, qlora: bool = False) -> Estimate:
    """Peak allocated bytes of one steady-state step of `w` on one device, with a breakdown.

    `qlora=True` (needs `w.lora_rank > 0`): the frozen base Linear weights are stored in NF4
    (Dettmers et al. 2023); embeddings and norms stay in the workload's precision.
    """
    w.validate()
    if qlora and w.lora_rank == 0:
        raise WorkloadError("QLoRA 需要 LoRA：请同时给出 --lora-rank r（r > 0）")
    if w.inference:
        return estimate_inference(w.model, w.batch, w.seq, w.compute_dtype_name, kv_cache=False,
                                  attention=w.attention, _workload=w)
    p = get_preset(w.model)
    d = _bytes_of(w)
    params = param_count(p)
    lora = w.lora_rank > 0
    trainable = lora_params(p, w.lora_rank) if lora else params
    n_dev = w.gpus if w.zero else 1
    notes: dict[str, str] = {}

    # --- weights, gradients, optimizer state (persistent) ---------------------------------------
    mm = matmul_weight_params(p)
    if qlora:
        base_w = qlora_weight_bytes(mm) + (params - mm) * d.param
        notes["parameters"] = (f"QLoRA：线性层权重用 NF4 存储，4 bit + 双重量化常数 ≈ 0.516 字节/参数"
                               f"（{mm:,} 个），其余 {params - mm:,} 个参数 {d.param} 字节；")
    else:
        base_w = params * d.param
        notes["parameters"] = f"{params:,} 个参数 × {d.param} 字节（{w.param_dtype_name}）；"
    if lora:   # adapters: fp32 (peft upcasts adapter weights), trained with fp32 grads and state
        weights, w_bytes, g_bytes, s_bytes = base_w + trainable * 4, 4, 4, 4
        notes["parameters"] += f"LoRA 适配器 {trainable:,} 个参数 × 4 字节（peft 默认把适配器升为 fp32）；"
    elif w.zero and w.mixed:   # DeepSpeed-style: 16-bit weights/grads, fp32 master copy in the optimizer
        weights, w_bytes, g_bytes, s_bytes = params * 2, 2, 2, 4
    else:
        weights, w_bytes, g_bytes, s_bytes = base_w, d.param, d.param, d.param
    grads = trainable * g_bytes
    state = optimizer_state_bytes(w.optimizer, trainable, s_bytes, adafactor_factored_elements(p, w.lora_rank))
    if w.zero and w.mixed and not lora:
        state += params * 4   # fp32 master weights: ZeRO's K = 12 = 4 (master) + 8 (Adam)
    # ZeRO sharding (Rajbhandari et al. 2020): stage 1 state, 2 + grads, 3 + weights
    if w.zero >= 1:
        state //= n_dev
    if w.zero >= 2:
        grads //= n_dev
    if w.zero >= 3:
        weights //= n_dev
    autocast_cache = mm * 2 if (w.mixed and not w.zero and not qlora) else 0

    # --- activations and logits -----------------------------------------------------------------
    act = activation_bytes(w, p)
    lg = logits_bytes(w, p)
    ckpt = w.checkpointing == "full"
    if w.offload == "activations":   # save_on_cpu: the 16-bit weight copies saved by matmuls go too
        saved_casts = 0
    elif ckpt:                       # only the LM head's saved copy survives the forward
        saved_casts = p.vocab * p.hidden * 2 if autocast_cache else 0
    else:
        saved_casts = autocast_cache
    block = sum(b for _, b in saved_per_block(w, p))
    ws = 2 * CUBLAS_WORKSPACE_BYTES
    grads_now = grads if w.accum > 1 else 0   # set_to_none=True: grads are freed after each step

    # --- optimizer temporaries ------------------------------------------------------------------
    temp_opt = _optimizer_temp_bytes(w, p, trainable, s_bytes, lora) // (n_dev if w.zero else 1)
    zero3_gather = 2 * block_params(p) * w_bytes if w.zero == 3 else 0   # current + prefetched layer
    dequant = max(i * o for i, o, _ in linear_shapes(p).values()) * d.act if qlora else 0

    phases = {
        "forward_end": dict(parameters=weights + autocast_cache, gradients=grads_now, optimizer_state=state,
                            activations=act, logits_and_loss=lg["forward_end"],
                            temporaries=zero3_gather + dequant, cuda_overhead=ws),
        "backward_start": dict(parameters=weights + saved_casts, gradients=grads_now, optimizer_state=state,
                               activations=act, logits_and_loss=lg["backward_start"],
                               temporaries=zero3_gather + dequant, cuda_overhead=ws),
        # all gradients exist; the first block's activations (or one recomputed block) are still alive
        "backward_end": dict(parameters=weights + autocast_cache // max(1, p.n_layers), gradients=grads,
                             optimizer_state=state, activations=(act if ckpt else 0) + block,
                             logits_and_loss=0, temporaries=zero3_gather + dequant, cuda_overhead=ws),
        "optimizer_step": dict(parameters=weights, gradients=grads, optimizer_state=state, activations=0,
                               logits_and_loss=0, temporaries=temp_opt, cuda_overhead=ws),
    }
    totals = {k: sum(v.values()) for k, v in phases.items()}
    peak = max(PHASES, key=lambda k: totals[k])
    breakdown = {k: int(phases[peak][k]) for k in KEYS}

    notes["parameters"] += _param_note(w, autocast_cache, saved_casts, peak, n_dev)
    notes["gradients"] = _grad_note(w, trainable, g_bytes, peak, n_dev)
    notes["optimizer_state"] = _state_note(w, trainable, s_bytes, n_dev)
    notes["activations"] = _act_note(w, p, act, block, peak)
    notes["logits_and_loss"] = (f"logits 与 loss：N·V = {w.batch * w.seq:,} × {p.vocab:,}。HF 先把 logits 升为 fp32"
                                f"（logits.float()），前向末尾有 logits + fp32 副本 + log_softmax 输出；反向开始时有 "
                                f"log_softmax 输出、nll_loss 的梯度和 log_softmax 的梯度 = 3 × N·V × 4 字节"
                                f"（{_mib(lg['backward_start'])}）。")
    notes["temporaries"] = _temp_note(w, temp_opt, zero3_gather, dequant, peak)
    notes["cuda_overhead"] = ("cuBLAS 工作区由 PyTorch 缓存分配器分配，计入 max_memory_allocated：Hopper（sm90）默认 "
                              "CUBLAS_WORKSPACE_CONFIG=:4096:8 = 32 MiB（见 ATen/cuda/CublasHandlePool.cpp）；"
                              "反向在 autograd 自己的线程上跑、用另一个 cuBLAS 句柄，所以训练时有 2 份 = 64 MiB。"
                              "CUDA 上下文本身（约 600–700 MiB）不在分配器里，不计入。")
    notes["peak"] = f"峰值时刻：{_PHASE_ZH[peak]}（各时刻估计：" + "，".join(
        f"{_PHASE_ZH[k]} {_mib(v)}" for k, v in totals.items()) + "）"
    return Estimate(w, int(totals[peak]), breakdown, notes, params, trainable, peak, totals)


_PHASE_ZH = {"forward_end": "前向末尾", "backward_start": "反向开始", "backward_end": "反向末尾",
             "optimizer_step": "优化器 step", "prefill": "前向（prefill）"}


def _optimizer_temp_bytes(w: Workload, p: Preset, trainable: int, s_bytes: int, lora: bool) -> int:
    """Extra memory while optimizer.step() runs.

    foreach AdamW (PyTorch's default on GPU, torch/optim/adamw.py `_multi_tensor_adamw`) computes
    `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` for all parameters at once: one full copy.
    The for-loop variant (foreach=False) and Adafactor allocate one parameter-sized buffer at a time
    (the largest is the embedding). SGD(+momentum) and bitsandbytes' 8-bit AdamW update in place.
    """
    if w.optimizer in ("sgd", "sgdm", "adamw8bit"):
        return 0
    if w.optimizer == "adamw" and w.foreach:
        return trainable * s_bytes
    largest = max(p.vocab * p.hidden, max(i * o for i, o, _ in linear_shapes(p).values()))
    return (trainable if lora else largest) * s_bytes


def _param_note(w, cache, saved_casts, peak, n_dev):
    s = ""
    if cache:
        s += (f"autocast 把 fp32 权重转成 16 位副本并缓存到退出 autocast（{_mib(cache)}，= 矩阵乘权重 × 2 字节）；"
              f"反向时只剩被 matmul 保存的那部分（{_mib(saved_casts)}）。")
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
           "adamw8bit": "8-bit AdamW（Dettmers 2022）：m、v 各 1 字节 + 分块量化常数 ≈ 2.004 字节/参数",
           "adafactor": "Adafactor（Shazeer & Stern 2018）：矩阵的二阶矩分解为行向量 + 列向量（r + c 而不是 r·c），没有一阶矩"}
    s = per[w.optimizer] + f"；可训练参数 {trainable:,} 个。"
    if w.zero and w.mixed and not w.lora_rank:
        s += "ZeRO + 混合精度：另有 fp32 主权重 4 字节/参数（论文中 K = 12 = 4 + 8）。"
    if w.zero >= 1:
        s += f"ZeRO-{w.zero}：优化器状态按 {n_dev} 卡分片。"
    return s


def _act_note(w, p, act, block, peak):
    s = (f"autograd 为反向保存的张量（micro-batch {w.batch} × 序列 {w.seq}）。每层 {_mib(block)}，"
         f"按张量逐个累加（见 saved_per_block）；参考公式 Korthikanti 2022：每层 sbh·(34 + 5as/h) 字节（16 位）。")
    if w.attention == "sdpa":
        s += "SDPA（FlashAttention / memory-efficient）不保存 s² 的注意力分数。"
    else:
        s += "eager 注意力保存 B·heads·S² 的 softmax 输出（有 dropout 时还有 1 字节掩码和 dropout 输出）。"
    if w.checkpointing == "full":
        s += "全量检查点：每层只保留输入 B·S·h，反向时一次重算一层。"
    elif w.checkpointing == "selective":
        s += "选择性重算：丢掉 s² 的注意力张量，其余保留（Korthikanti：34·sbh）。"
    if w.offload == "activations":
        s += "save_on_cpu：保存的张量在主存里，设备上只剩反向时逐个取回的工作集。"
    if w.accum > 1:
        s += f"梯度累积：激活只与 micro-batch 有关，与累积步数 {w.accum} 无关。"
    if w.lora_rank:
        s += "LoRA：冻结层的输入不必保存（不需要它们的权重梯度），但梯度仍要流过所有层。"
    return s


def _temp_note(w, temp_opt, gather, dequant, peak):
    s = ""
    if w.optimizer == "adamw" and w.foreach:
        s += f"foreach AdamW 一次为全部参数算 sqrt(v)：临时多一份参数大小（{_mib(temp_opt)}），只在 step 时出现。"
    elif temp_opt:
        s += f"优化器逐个参数计算，临时缓冲最大为一个参数张量（{_mib(temp_opt)}）。"
    else:
        s += "优化器原地更新，没有大的临时张量。"
    if gather:
        s += f"ZeRO-3：当前层与预取层的完整权重（{_mib(gather)}）。"
    if dequant:
        s += f"QLoRA：每次矩阵乘前把一层 NF4 权重反量化为计算精度（{_mib(dequant)}）。"
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
