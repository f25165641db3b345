"""Chapter 26: prompt tuning prepends vectors to the input; prefix tuning prepends K/V in every layer.

Sketch with n = 3 virtual tokens and S = 5 real ones through 3 layers. Prompt tuning lengthens
the sequence to n + S in every layer (and in the logits); prefix tuning keeps S positions and
only lengthens each layer's keys and values. Below each panel: the trainable-parameter formula
evaluated for the chapter's Llama-2-7B shape with n = 20 (n*d and n*L*2*d_kv).
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

N_VIRT, S_REAL, SHOW_LAYERS = 3, 5, 3
L7B, D7B, N20 = 32, 4096, 20
CELL, GAP = 24, 4


def _row(f, x, y, kinds):
    for k, kind in enumerate(kinds):
        role = {"p": "grad", "v": "act", "x": "act"}[kind]
        f.rect(x + k * (CELL + GAP), y, CELL, CELL, role, rx=3, dash=(kind == "v"))


def draw() -> list[Figure]:
    f = Figure("ch26-prompt-vs-prefix", "提示微调只在输入端拼可训练向量、序列变长；前缀微调在每一层注意力的键和值前拼可训练前缀、序列不变",
               "示意：3 个虚拟 token、5 个真实 token、3 层。左：软提示拼在输入嵌入前，此后每层和 logits 都有 n + S 个位置。"
               "右：每层注意力的 K、V 前各拼 n 个可训练向量，没有自己的查询，序列仍是 S。"
               "下方是按公式算出的 Llama-2-7B、n = 20 时的可训练参数。",
               820, 420)
    panels = [("提示微调：序列变成 n + S", 24, True), ("前缀微调：每层 K、V 变成 n + S", 430, False)]
    for title, x0, prompt in panels:
        f.text(x0 + 180, 30, title, size=14, bold=True)
        xs = x0 + (150 if prompt else 110)
        y = 312
        f.text(xs - 12, y + 17, "输入嵌入", size=12, anchor="end")
        _row(f, xs, y, ["p"] * N_VIRT + ["x"] * S_REAL if prompt else ["x"] * S_REAL)
        for layer in range(SHOW_LAYERS):
            y -= 62
            name = f"第 {layer + 1} 层" if layer < SHOW_LAYERS - 1 else "第 L 层"
            f.text(xs - 12, y + 17, name, size=12, anchor="end")
            kinds = ["v"] * N_VIRT + ["x"] * S_REAL if prompt else ["x"] * S_REAL
            _row(f, xs, y, kinds)
            f.arrow(xs + 60, y + 58, xs + 60, y + CELL + 4, color="#9aa5b4", width=1)
            if not prompt:
                kx = xs + S_REAL * (CELL + GAP) + 22
                _row(f, kx, y + 26, ["p"] * N_VIRT)
                f.text(kx + 40, y + 20, "K/V 前缀", size=12, color=MUTED)
                f.arrow(kx - 2, y + 38, kx - 18, y + 16, color="#c46a2b", width=1.2)
        y -= 48
        f.text(xs - 12, y + 17, "logits", size=12, anchor="end")
        _row(f, xs, y, ["v"] * N_VIRT + ["x"] * S_REAL if prompt else ["x"] * S_REAL)
        if prompt:
            params, formula = N20 * D7B, "n · d"
        else:
            params, formula = N20 * L7B * 2 * D7B, "n · L · 2 · d_kv"
        f.text(x0 + 180, 362, f"可训练参数 = {formula}", size=13, bold=True)
        f.text(x0 + 180, 382, f"Llama-2-7B，n = {N20}：{params:,}", size=13)
    f.legend(24, 408, [("grad", "可训练（软提示 / 前缀）"), ("act", "冻结模型里的激活值")], step=200)
    f.text(796, 408, "虚线格：虚拟位置也要过每一层、算 logits", size=12, anchor="end", color=MUTED)
    return [f]
