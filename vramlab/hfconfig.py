"""A local Hugging Face `config.json` as a vramlab model preset: no download, no weights.

    p = load_config("vramlab/data/configs/llama-3.1-8b.json")    # or a folder holding config.json
    w = Workload(model=p.name, batch=1, seq=4096, precision="bf16", lora_rank=16)
    estimate(w); measure_workload(w, backend="sim", fake=True)

`load_config` reads the file, finds the family from `model_type` (or `architectures`), checks every
field the estimator and the simulated device need, and registers a `Preset` named `cfg:<name>` in
`vramlab.models.PRESETS` for this process, so the estimator, the runner and the trace recorder take
it like any built-in preset. Families and how each is built:

    llama, mistral, qwen2   Llama-style decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention,
                            tied or untied LM head; built as transformers' LlamaForCausalLM
    mixtral                 the same attention + a top-k mixture of SwiGLU experts (MixtralForCausalLM)
    gpt2                    GPT2LMHeadModel (gelu_new, learned positions, tied head)
    bert                    BertForMaskedLM (post-LN, absolute positions, 2 token types)

What is approximated, and by how much (both the estimate and the simulated device build the same
Llama-style model, so their agreement is not affected; the difference is to the real model):
* Qwen2 puts a bias on the q/k/v projections; the Llama build has none. That is
  layers x (q + 2 kv) parameters (Qwen2.5-7B: 28 x 4608 = 129,024, 0.002 % of its 7.6 B).
* Mistral's sliding window changes which positions attend, not what FlashAttention keeps in memory.
* RoPE scaling (`rope_scaling`, `rope_theta`) changes values, not shapes.
Anything else that changes shapes (another activation, biases on every projection, a different
number of token types...) is refused with a Chinese message naming the field.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .models import PRESETS, Preset
from .workload import WorkloadError

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "configs"

# model_type -> family; architectures are a fallback for configs without model_type
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "mixtral": "mixtral", "gpt2": "gpt2",
            "bert": "bert"}
_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
         "MixtralForCausalLM": "mixtral", "GPT2LMHeadModel": "gpt2", "BertForMaskedLM": "bert",
         "BertModel": "bert", "BertForPreTraining": "bert"}
FAMILY_ZH = {"llama": "Llama 式解码器（llama / mistral / qwen2）", "mixtral": "Mixtral 式 MoE 解码器",
             "gpt2": "GPT-2", "bert": "BERT"}
SUPPORTED_ZH = "llama、mistral、qwen2（Llama 式解码器）、mixtral（MoE）、gpt2、bert"

# fields each family must have (name in config.json)
REQUIRED = {
    "llama": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
    "mixtral": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "num_local_experts", "num_experts_per_tok"),
    "gpt2": ("n_embd", "n_layer", "n_head", "vocab_size"),
    "bert": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
}
# transformers' defaults for optional fields that change shapes (configuration_<model>.py, v5)
_MAX_POS_DEFAULT = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "mixtral": 4096 * 32, "bert": 512}


class ConfigError(WorkloadError):
    """A config.json vramlab cannot model; the message (Chinese) names the file and the field."""


def find_config_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ConfigError(f"文件夹 {p.parent} 里没有 config.json：请给出 config.json 本身，或存放它的文件夹")
    elif not p.exists():
        raise ConfigError(f"找不到配置文件 {p}（--config 需要本地的 Hugging Face config.json，不会联网下载）")
    return p


def read_config(path: str | Path) -> tuple[dict, Path]:
    p = find_config_file(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p} 不是 UTF-8 文本文件：config.json 应是 JSON 文本") from None
    except OSError as e:
        from .errors import os_error_zh
        raise ConfigError(f"无法读取配置文件 {os_error_zh(e)}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} 不是合法的 JSON（第 {e.lineno} 行第 {e.colno} 列附近）") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p} 的内容应是一个 JSON 对象（{{...}}），收到 {type(cfg).__name__}")
    return cfg, p


def model_type_of(cfg: dict) -> str | None:
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt:
        return mt
    for arch in cfg.get("architectures") or []:
        if arch in _ARCH:
            return _ARCH[arch]
    return None


def _int(cfg, key, where, minimum=1):
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{where}：字段 {key} 应是 ≥ {minimum} 的整数，收到 {v!r}")
    return v


def preset_from_config(cfg: dict, name: str = "config", where: str = "config.json") -> Preset:
    """The `Preset` for config dict `cfg` (not registered). Raises ConfigError (Chinese)."""
    mt = model_type_of(cfg)
    if mt is None:
        raise ConfigError(f"{where} 没有 model_type，architectures 里也没有认识的结构："
                          f"无法判断模型家族。vramlab 支持：{SUPPORTED_ZH}")
    if mt not in FAMILIES:
        arch = "、".join(cfg.get("architectures") or []) or "未给出"
        raise ConfigError(f"{where}：不支持的模型结构 model_type={mt!r}（architectures：{arch}）。"
                          f"vramlab 能按形状建模的家族：{SUPPORTED_ZH}")
    family = FAMILIES[mt]
    missing = [k for k in REQUIRED[family] if cfg.get(k) is None]
    if family == "gpt2" and cfg.get("n_positions") is None and cfg.get("n_ctx") is None:
        missing.append("n_positions")
    if missing:
        raise ConfigError(f"{where}：{mt} 模型（{FAMILY_ZH[family]}）缺少字段 {'、'.join(missing)}；"
                          f"这一家族需要：{'、'.join(REQUIRED[family])}")
    for key in REQUIRED[family]:
        _int(cfg, key, where)
    unsupported = []

    def refuse(key, value, need):
        unsupported.append(f"{key}={value!r}（vramlab 只能建模 {need}）")

    if family == "gpt2":
        h, heads = cfg["n_embd"], cfg["n_head"]
        act = cfg.get("activation_function", "gelu_new")
        if act != "gelu_new":
            refuse("activation_function", act, "gelu_new")
        out = dict(n_layer=cfg["n_layer"], n_embd=h, n_head=heads, vocab_size=cfg["vocab_size"],
                   n_positions=_int(cfg, "n_positions" if cfg.get("n_positions") is not None else "n_ctx", where),
                   bos_token_id=cfg["vocab_size"] - 1, eos_token_id=cfg["vocab_size"] - 1)
        if cfg.get("n_inner") is not None:
            out["n_inner"] = _int(cfg, "n_inner", where)
    elif family == "bert":
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        for key, value, need in (("hidden_act", cfg.get("hidden_act", "gelu"), "gelu"),
                                 ("type_vocab_size", cfg.get("type_vocab_size", 2), 2),
                                 ("position_embedding_type", cfg.get("position_embedding_type", "absolute"),
                                  "absolute")):
            if value != need:
                refuse(key, value, need)
        out = dict(num_hidden_layers=cfg["num_hidden_layers"], hidden_size=h, num_attention_heads=heads,
                   intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                   max_position_embeddings=_int(cfg, "max_position_embeddings", where)
                   if cfg.get("max_position_embeddings") is not None else _MAX_POS_DEFAULT["bert"])
    else:
        h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            refuse("hidden_act", act, "silu（SwiGLU）")
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                refuse(key, cfg[key], "false（线性层不带偏置）")
        if mt == "mixtral" and cfg.get("num_experts_per_tok", 0) > cfg.get("num_local_experts", 0):
            refuse("num_experts_per_tok", cfg["num_experts_per_tok"], "≤ num_local_experts")
        kv = _int(cfg, "num_key_value_heads", where) if cfg.get("num_key_value_heads") is not None else heads
        if heads % kv:
            refuse("num_key_value_heads", kv, f"num_attention_heads（{heads}）的约数")
        out = dict(num_hidden_layers=cfg["num_hidden_layers"], hidden_size=h, num_attention_heads=heads,
                   num_key_value_heads=kv, intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                   max_position_embeddings=_int(cfg, "max_position_embeddings", where)
                   if cfg.get("max_position_embeddings") is not None else _MAX_POS_DEFAULT[mt],
                   tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   bos_token_id=0, eos_token_id=1, pad_token_id=None)
        if cfg.get("head_dim") is not None:
            out["head_dim"] = _int(cfg, "head_dim", where)
        if mt == "mixtral":
            out.update(num_local_experts=cfg["num_local_experts"], num_experts_per_tok=cfg["num_experts_per_tok"])
    if h % heads and "head_dim" not in out:
        refuse("n_embd" if family == "gpt2" else "hidden_size", h, f"注意力头数（{heads}）的整数倍")
    if unsupported:
        raise ConfigError(f"{where}：{mt} 模型有 vramlab 不能建模的设置：{'；'.join(unsupported)}")
    note = _note(mt, cfg, out)
    p = Preset(name, family, out, note=note)
    from .estimate import param_count
    params = param_count(p)
    # above ~0.5 B parameters real tensors on the CPU take GBs: build under FakeTensorMode instead
    return Preset(name, family, out, fake_only=params > 500_000_000, note=note)


def _note(mt: str, cfg: dict, out: dict) -> str:
    parts = [f"来自 config.json（model_type={mt}）"]
    if mt == "qwen2":
        hd = out.get("head_dim") or out["hidden_size"] // out["num_attention_heads"]
        bias = out["num_hidden_layers"] * hd * (out["num_attention_heads"] + 2 * out["num_key_value_heads"])
        parts.append(f"按 Llama 结构建模：Qwen2 的 q/k/v 偏置（共 {bias:,} 个参数）未计入")
    if mt == "mistral" and cfg.get("sliding_window"):
        parts.append(f"滑动窗口 {cfg['sliding_window']} 只改变注意力范围，不改变 FlashAttention 保存的张量")
    return "；".join(parts)


def _label(path: Path) -> str:
    stem = path.parent.name if path.name == "config.json" else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "config"


def register(preset: Preset) -> Preset:
    """Put `preset` in PRESETS (this process only). A different preset under the same name gets a
    short content hash appended, so two configs named alike never replace each other."""
    old = PRESETS.get(preset.name)
    if old is not None and old.config != preset.config:
        digest = hashlib.sha256(json.dumps(preset.config, sort_keys=True).encode()).hexdigest()[:6]
        preset = Preset(f"{preset.name}-{digest}", preset.family, preset.config, preset.fake_only, preset.note)
    PRESETS[preset.name] = preset
    return preset


def load_config(path: str | Path) -> Preset:
    """Read a local config.json (or a folder holding one) and register it as preset `cfg:<name>`."""
    cfg, p = read_config(path)
    return register(preset_from_config(cfg, name=f"cfg:{_label(p)}", where=str(p)))


def load_config_dict(cfg: dict, name: str = "pasted") -> Preset:
    """Same as `load_config` for a dict already in memory (e.g. pasted into a web form)."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json 的内容应是一个 JSON 对象（{...}）")
    return register(preset_from_config(cfg, name=f"cfg:{name}", where=name))


def sample_configs() -> list[Path]:
    """The configs shipped with vramlab (vramlab/data/configs/*.json), sorted by name."""
    return sorted(CONFIG_DIR.glob("*.json"))
