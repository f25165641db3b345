"""A workload: one model, batch, sequence and set of memory techniques, as the CLI and the
reference table name them. `build_step` turns it into a training step you can measure.

The same description drives `vramlab estimate` (analytic), `vramlab measure` (sim or cuda) and
`vramlab calibrate` (each H200 reference row on both), so the three always talk about one thing.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace

from .models import PRESETS, get_preset

OPTIMIZERS = ("sgd", "sgdm", "adamw", "adamw8bit", "adafactor")
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed")
CHECKPOINTING = ("none", "full", "selective")
ATTENTION = ("sdpa", "eager")
OFFLOAD = ("none", "activations")
# Which Linear layers LoRA adapts (vramlab.estimate.lora_target_names has them per family):
#   default     peft's default per family (peft.utils.constants, TRANSFORMERS_MODELS_TO_LORA_TARGET_
#               MODULES_MAPPING): GPT-2 c_attn; BERT query, value; Llama/Mistral/Qwen2/Mixtral q_proj, v_proj
#   qkvo        every attention projection: q, k, v and the output projection
#   all-linear  peft's target_modules="all-linear": every Linear (GPT-2: Conv1D) except the output layer
LORA_TARGETS = ("default", "qkvo", "all-linear")


class WorkloadError(ValueError):
    """An impossible or malformed workload; the message is for learners, in Chinese."""


@dataclass(frozen=True)
class Workload:
    model: str = "gpt2-small"
    batch: int = 8              # micro-batch size
    seq: int = 512
    optimizer: str = "adamw"
    precision: str = "fp32"
    checkpointing: str = "none"
    attention: str = "sdpa"
    dropout: float = 0.0
    lora_rank: int = 0
    zero: int = 0
    gpus: int = 1
    accum: int = 1              # micro-batches per optimizer step
    offload: str = "none"       # "activations": saved tensors go to host memory (save_on_cpu)
    foreach: bool = True        # AdamW's multi-tensor path (PyTorch's default on GPU)
    inference: bool = False     # forward only, under torch.inference_mode
    lora_targets: str = "default"   # see LORA_TARGETS
    qlora: bool = False         # the base's Linear layers in NF4 (bitsandbytes), prepared as peft's QLoRA recipe

    def validate(self) -> "Workload":
        def bad(msg):
            raise WorkloadError(msg)
        if self.model not in PRESETS:
            bad(f"未知模型预设 {self.model!r}；可选：{', '.join(PRESETS)}")
        for name, value, allowed in (("optimizer", self.optimizer, OPTIMIZERS),
                                     ("precision", self.precision, PRECISIONS),
                                     ("checkpointing", self.checkpointing, CHECKPOINTING),
                                     ("attention", self.attention, ATTENTION),
                                     ("offload", self.offload, OFFLOAD),
                                     ("lora-targets", self.lora_targets, LORA_TARGETS)):
            if value not in allowed:
                bad(f"--{name} 不支持 {value!r}；可选：{', '.join(allowed)}")
        for name in ("batch", "seq", "accum", "gpus"):
            if getattr(self, name) < 1:
                bad(f"--{name} 必须是正整数，收到 {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            bad(f"--dropout 必须在 [0, 1) 之间，收到 {self.dropout}")
        if self.lora_rank < 0:
            bad(f"--lora-rank 不能为负，收到 {self.lora_rank}")
        if self.qlora and self.lora_rank == 0:
            bad("QLoRA 需要 LoRA：请同时给出 --lora-rank r（r > 0）")
        if self.zero not in (0, 1, 2, 3):
            bad(f"--zero 只能是 0/1/2/3，收到 {self.zero}")
        if self.zero and self.gpus < 2:
            bad("ZeRO 需要多张卡分片：请同时给出 --gpus N（N ≥ 2）")
        preset = get_preset(self.model)
        max_pos = preset.config.get("n_positions", preset.config.get("max_position_embeddings"))
        if self.seq > max_pos:
            bad(f"模型 {self.model} 最多支持 {max_pos} 个位置，--seq {self.seq} 太长")
        if self.seq * self.batch > 2**31:
            bad("batch × seq 太大：超过 2^31 个 token")
        return self

    @property
    def mixed(self) -> bool:
        return self.precision.endswith("-mixed")

    @property
    def param_dtype_name(self) -> str:
        return self.precision if self.precision in ("bf16", "fp16") else "fp32"

    @property
    def compute_dtype_name(self) -> str:
        return self.precision.split("-")[0]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Workload":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_MODEL_OF_PREFIX = {"small": "gpt2-small", "medium": "gpt2-medium", "mini": "gpt2-mini", "tiny": "tiny"}


def from_reference_name(name: str) -> Workload:
    """Parse a row name of the H200 reference table, e.g. 'small_fp32_adamw_b8_s512_drop0.1_eager'."""
    tokens = name.split("_")
    if tokens[0] not in _MODEL_OF_PREFIX:
        raise WorkloadError(f"无法解析参考配置名 {name!r}")
    w = dict(model=_MODEL_OF_PREFIX[tokens[0]])
    for tok in tokens[1:]:
        if tok == "fp32":
            w["precision"] = "fp32"
        elif tok == "bf16autocast":
            w["precision"] = "bf16-mixed"
        elif tok in ("purebf16", "bf16weights"):
            w["precision"] = "bf16"
        elif tok in ("adamw", "adafactor", "sgdm", "sgd"):
            w["optimizer"] = tok
        elif tok == "adamw8bit":
            w["optimizer"] = "adamw8bit"
        elif tok == "noforeach":
            w["foreach"] = False
        elif tok == "lora":
            w["lora_rank"] = 8
        elif tok == "ckpt":
            w["checkpointing"] = "full"
        elif tok == "eager":
            w["attention"] = "eager"
        elif tok == "saveoncpu":
            w["offload"] = "activations"
        elif tok == "infer":
            w["inference"] = True
        elif m := re.fullmatch(r"b(\d+)x(\d+)accum", tok):
            w["batch"], w["accum"] = int(m.group(1)), int(m.group(2))
        elif m := re.fullmatch(r"b(\d+)", tok):
            w["batch"] = int(m.group(1))
        elif m := re.fullmatch(r"s(\d+)", tok):
            w["seq"] = int(m.group(1))
        elif m := re.fullmatch(r"drop([0-9.]+)", tok):
            w["dropout"] = float(m.group(1))
        else:
            raise WorkloadError(f"参考配置名 {name!r} 中有无法解析的部分 {tok!r}")
    if "optimizer" not in w and w.get("lora_rank"):
        w["optimizer"] = "adamw"     # the reference's LoRA rows train the adapters with AdamW
    return Workload(**w).validate()


def with_changes(w: Workload, **changes) -> Workload:
    return replace(w, **changes).validate()
