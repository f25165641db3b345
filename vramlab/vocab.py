"""The words for memory: categories a byte of device memory is filed under, and their Chinese labels.

Every table, report, trace and calculator in vramlab names memory with these keys and shows these
labels, so that "激活值" on a chapter page, in `vramlab measure`, in a grading report and in the
timeline viewer are the same bytes. The simulated device files each live storage under one key
(vramlab/sim/tracker.py); the estimator's breakdown uses the same keys (vramlab/estimate.py).

    CATEGORIES      key -> (label, what it holds)      in the order tables show them
    label(key)      the Chinese label, or the key itself for one this module does not know
"""
from __future__ import annotations

CATEGORIES: dict[str, tuple[str, str]] = {
    "parameters": ("模型参数", "模型的权重和缓冲区"),
    "gradients": ("梯度", "参数的 .grad"),
    "optimizer_state": ("优化器状态", "例如 AdamW 的一阶、二阶矩"),
    "activations": ("激活值", "前向保存给反向用的张量，包括梯度检查点在反向时重算的"),
    "logits_and_loss": ("logits 与损失", "输出层的 logits 和损失的中间量"),
    "temporaries": ("临时张量", "反向和优化器 step 里新建的（反向时重算的激活值仍算激活值）"),
    "cuda_overhead": ("CUDA 开销（cuBLAS 工作区）", "cuBLAS 工作区等 CUDA 库自己的显存"),
    "other": ("其他", "在模型的模块之外新建的，例如你的函数里直接算的张量"),
    "unknown": ("未分类（CUDA 分配器不知道用途）", "真卡上的 trace 里，CUDA 分配器不知道用途的显存"),
    "before_trace": ("记录开始前已分配", "时间线开始记录之前已经在显存里的"),
}

# the categories a training step's peak is made of (reports and savings tables list these)
STEP_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "logits_and_loss", "temporaries",
                   "cuda_overhead", "other")

# where a technique saves memory: the grading report's "what you saved" table
SAVED_BY = {
    "parameters": "bf16/8-bit 权重",
    "gradients": "低精度梯度、在反向中更新并释放",
    "optimizer_state": "8-bit 优化器、卸载到主存",
    "activations": "激活检查点、混合精度、激活值卸载",
    "temporaries": "梯度累积、分块计算",
    "cuda_overhead": "cuBLAS 工作区",
}

# the phases of a training step, as the timeline and the calculator name them
PHASES: dict[str, str] = {
    "forward": "前向", "backward": "反向", "optimizer": "优化器 step", "idle": "步与步之间",
}


def label(key: str) -> str:
    return CATEGORIES[key][0] if key in CATEGORIES else key


def labels(keys=None) -> dict[str, str]:
    """{key: label} for `keys` (default: every category), in the canonical order."""
    keys = list(CATEGORIES) if keys is None else list(keys)
    return {k: label(k) for k in keys}


def note(key: str) -> str:
    return CATEGORIES[key][1] if key in CATEGORIES else ""
