"""Chapter 24: LoRA keeps W0 frozen and trains a low-rank bypass B A; QLoRA stores W0 in NF4.

Left: h = W0 x + (alpha / r) B A x, a sketch (not to scale) with A and B as thin matrices.
Right: Llama-2-7B model states, computed with the chapter's formulas: full fine-tuning 16 N;
LoRA r = 16 on all linear layers with a BF16 base, 2 N + 16 N_LoRA; QLoRA with the linear weights
in NF4 + double quantization (about 0.516 bytes each), the rest in BF16.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

N = 6_738_415_616                                    # Llama-2-7B shape
LAYERS, H, FFN, RANK = 32, 4096, 11008, 16
N_LINEAR = LAYERS * (4 * H * H + 3 * H * FFN)
N_REST = N - N_LINEAR                                # embeddings, output layer, norms
N_LORA = LAYERS * RANK * (4 * (H + H) + 3 * (H + FFN))
NF4_DQ = 0.5 + 1 / 64 + 4 / (64 * 256)               # bytes per weight, NF4 block 64 + double quant


ADAPTER = [(4 * N_LORA, "param"), (4 * N_LORA, "grad"), (8 * N_LORA, "optim")]   # FP32 A, B + AdamW


def draw() -> list[Figure]:
    bars = [
        ("全量微调", "混合精度 + Adam", [(2 * N, "param"), (2 * N, "grad"), (12 * N, "optim")]),
        ("LoRA", "BF16 基座", [(2 * N, "param")] + ADAPTER),
        ("QLoRA", "NF4 基座", [(NF4_DQ * N_LINEAR + 2 * N_REST, "param")] + ADAPTER),
    ]
    f = Figure("ch24-lora-qlora", "LoRA 的结构：冻结的 W0 旁挂低秩的 B·A；以及 Llama-2-7B 全量微调、LoRA、QLoRA 的模型状态",
               "左：输出 h = W0·x + (α/r)·B·A·x，W0 冻结（QLoRA 中存成 NF4），只有 A、B 接收梯度。"
               "右：按本章公式算出的 Llama-2-7B 模型状态，全量微调 107.8 GB，LoRA（r = 16，全部线性层，BF16 基座）14.1 GB，"
               "QLoRA 4.5 GB。",
               820, 424)
    # --- left: structure ---
    f.text(200, 30, "h = W0·x + (α/r)·B·A·x", size=15, bold=True, mono=True)
    f.box(20, 170, 60, 40, "x", "act")
    f.box(120, 70, 150, 110, "W0（冻结）", "param", size=14, sub="d_out × d_in")
    f.text(195, 198, "BF16，或 QLoRA 的 NF4", size=12, color=MUTED)
    f.box(110, 246, 170, 26, "A：r × d_in（可训练）", "grad", size=12)
    f.box(300, 214, 26, 110, "", "grad")
    f.text(313, 340, "B：d_out × r", size=12)
    f.text(313, 356, "可训练，初始化为 0", size=12, color=MUTED)
    f.box(360, 170, 44, 40, "+", "neutral", size=16)
    f.box(430, 170, 44, 40, "h", "act")
    f.arrow(80, 180, 118, 130)
    f.arrow(80, 200, 108, 256)
    f.arrow(270, 125, 380, 168)
    f.arrow(280, 259, 298, 259)
    f.arrow(326, 240, 370, 210)
    f.text(372, 246, "× α/r", size=12, anchor="start")
    f.arrow(404, 190, 428, 190)
    f.text(200, 388, "梯度只流向 A、B；W0 没有梯度，也没有优化器状态", size=12, color=MUTED)

    # --- right: model states ---
    base, top, x0 = 330, 70, 520
    scale = (base - top) / (16 * N)
    f.text(660, 30, "Llama-2-7B 的模型状态", size=14, bold=True)
    for b, (name, sub, segs) in enumerate(bars):
        x, y = x0 + b * 100, base
        for nbytes, role in segs:
            f.rect(x, y - nbytes * scale, 64, nbytes * scale, role, rx=1)
            y -= nbytes * scale
        total = sum(n for n, _ in segs) / 1e9
        f.text(x + 32, y - 8, f"{total:.1f} GB", size=13, bold=True)
        f.text(x + 32, base + 20, name, size=13)
        f.text(x + 32, base + 37, sub, size=12, color=MUTED)
    f.line(x0 - 10, base, 806, base, color="#999999", width=1)
    f.legend(x0 - 10, 388, [("param", "参数"), ("grad", "梯度"), ("optim", "状态")], step=80)
    f.text(660, 412, f"LoRA r = {RANK}，全部线性层：A、B 共 {N_LORA:,} 个参数", size=12, color=MUTED)
    return [f]
