"""Ch10: what each GPU keeps under DDP and ZeRO stages 1/2/3 (mixed precision + Adam, 2 + 2 + K bytes/param).

Left: a 4-GPU sketch, each GPU's three model states; a sharded state keeps only that GPU's 1/N slice.
Right: per-GPU model states from the ZeRO paper's formulas for its example, Psi = 7.5e9, N_d = 64, K = 12
(120, 31.4, 16.6, 1.9 GB), computed here.
"""
from diagrams.svg import MUTED, Figure

PSI, ND, K = 7.5e9, 64, 12
N_SKETCH = 4
STATES = [("param", 2), ("grad", 2), ("optim", K)]        # role, bytes per parameter
STAGES = [  # label, which states are sharded, formula text
    ("DDP（不分片）", set(), "16Ψ"),
    ("ZeRO-1：切优化器状态", {"optim"}, "4Ψ + 12Ψ/N"),
    ("ZeRO-2：再切梯度", {"optim", "grad"}, "2Ψ + 14Ψ/N"),
    ("ZeRO-3：再切参数", {"optim", "grad", "param"}, "16Ψ/N"),
]


def per_gpu_bytes(sharded, psi, n):
    return sum(b * psi / (n if role in sharded else 1) for role, b in STATES)


def draw():
    W, x0, top, row, cw, bar = 780, 178, 64, 58, 92, 80
    H = top + row * len(STAGES) + 34
    f = Figure("ch10-zero-stages", "ZeRO 三个阶段在每张卡上保留什么：参数、梯度、优化器状态的分片",
               "左边是 4 张卡的示意：不分片时每张卡存全部三样；ZeRO-1、2、3 依次把优化器状态、梯度、参数切成 4 份，每张卡只留自己那一份。"
               "右边按 ZeRO 论文的例子（75 亿参数、64 张卡、混合精度 + Adam）算出每卡的模型状态。", W, H)
    f.text(x0 + N_SKETCH * cw / 2, 22, f"示意：N = {N_SKETCH} 张卡", bold=True)
    for g in range(N_SKETCH):
        f.text(x0 + g * cw + bar / 2, 46, f"GPU{g}", size=12, color=MUTED)
    f.text(W - 16, 22, f"每卡模型状态（Ψ = {PSI / 1e8:.0f} 亿，N = {ND}）", anchor="end", bold=True)
    for i, (label, sharded, formula) in enumerate(STAGES):
        y = top + i * row
        f.text(x0 - 12, y + 26, label, anchor="end")
        for g in range(N_SKETCH):
            for k, (role, _) in enumerate(STATES):
                yy, x = y + 4 + k * 14, x0 + g * cw
                if role in sharded:
                    f.rect(x, yy, bar, 11, "free", rx=1, dash=True)
                    f.rect(x + g * bar / N_SKETCH, yy, bar / N_SKETCH, 11, role, rx=1)
                else:
                    f.rect(x, yy, bar, 11, role, rx=1)
        gb = per_gpu_bytes(sharded, PSI, ND) / 1e9
        f.text(W - 150, y + 26, formula, anchor="start", mono=True, size=12)
        f.text(W - 16, y + 26, f"{gb:.0f} GB" if gb >= 100 else f"{gb:.1f} GB", anchor="end", bold=True)
    f.legend(x0, H - 14, [("param", "16 位参数 2Ψ"), ("grad", "16 位梯度 2Ψ"), ("optim", f"优化器状态 {K}Ψ"),
                          ("free", "分给别的卡")])
    return [f]
