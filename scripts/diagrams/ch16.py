"""Chapter 16: MHA / GQA / MQA share key-value heads, and the KV cache shrinks with n_kv.

Top: a = 8 query heads wired to n_kv = 8, 2, 1 key-value heads (query head i uses KV head
floor(i / g), g = a / n_kv). Bottom: KV cache per token, 2 * L * n_kv * d * 2 bytes (BF16), for
the chapter's table of real configs, with the S = 4096, B = 16 totals beside each bar.
"""
from __future__ import annotations

from diagrams.svg import MUTED, Figure

# (label, layers L, query heads a, kv heads n_kv, head dim d): the chapter's table (config.json)
MODELS = [
    ("Llama-2-7B", 32, 32, 32, 128),
    ("Llama-3-8B", 32, 32, 8, 128),
    ("Llama-2-70B", 80, 64, 8, 128),
    ("（假想）Llama-2-70B 改为 MHA", 80, 64, 64, 128),
]
BYTES = 2            # BF16
S, B = 4096, 16      # the table's last column


def kv_bytes_per_token(L, n_kv, d, p=BYTES):
    return 2 * L * n_kv * d * p


def _heads(f, x0, y0, a, n_kv, title):
    g = a // n_kv
    w, gap = 24, 5
    qx = [x0 + i * (w + gap) for i in range(a)]
    span = a * w + (a - 1) * gap
    kw = w if n_kv == a else min(3 * w, span / n_kv - gap)
    kgap = (span - n_kv * kw) / max(n_kv - 1, 1)
    kx = [x0 + j * (kw + kgap) for j in range(n_kv)] if n_kv > 1 else [x0 + (span - kw) / 2]
    f.text(x0 + span / 2, y0, title, size=14, bold=True)
    for i, x in enumerate(qx):
        f.rect(x, y0 + 14, w, 22, "neutral")
        f.text(x + w / 2, y0 + 30, f"Q{i}", size=12)
        j = i // g
        f.line(x + w / 2, y0 + 36, kx[j] + kw / 2, y0 + 82, color="#8a97a8", width=1.2)
    for j, x in enumerate(kx):
        f.rect(x, y0 + 82, kw, 22, "act")
        f.text(x + kw / 2, y0 + 98, f"KV{j}" if kw < 40 else f"K/V {j}", size=12)
    note = "每个查询头各有一个" if g == 1 else f"每 {g} 个查询头共享一个"
    f.text(x0 + span / 2, y0 + 124, f"n_kv = {n_kv}，{note}", size=12, color=MUTED)


def draw() -> list[Figure]:
    f = Figure("ch16-gqa-kv-cache", "MHA、GQA、MQA 的键值头共享方式，以及几种 Llama 配置每个 token 的键值缓存大小",
               "上半部分：8 个查询头分别连到 8、2、1 个键值头，第 i 个查询头用第 ⌊i/g⌋ 个键值头。"
               "下半部分：按 2·L·n_kv·d·2 字节（BF16）算出的每 token 键值缓存，右侧是 S = 4096、B = 16 时的总量。",
               820, 440)
    for k, (n_kv, name) in enumerate([(8, "MHA（n_kv = a）"), (2, "GQA（1 < n_kv < a）"), (1, "MQA（n_kv = 1）")]):
        _heads(f, 24 + k * 268, 30, 8, n_kv, name)
    f.legend(24, 186, [("neutral", "查询头（a = 8）"), ("act", "键值头：推理时每层每 token 缓存一份 K 和 V")], step=150)

    top, bar_h, gap, x_bar, max_w = 232, 26, 12, 250, 330
    f.text(24, top - 10, "每 token 的键值缓存 = 2 · L · n_kv · d · 2 字节（BF16）", size=13, anchor="start", bold=True)
    biggest = max(kv_bytes_per_token(L, n, d) for _, L, _, n, d in MODELS)
    for r, (label, L, a, n_kv, d) in enumerate(MODELS):
        y = top + 8 + r * (bar_h + gap)
        per_tok = kv_bytes_per_token(L, n_kv, d)
        w = max_w * per_tok / biggest
        f.text(x_bar - 10, y + 18, label, size=13, anchor="end")
        f.rect(x_bar, y, w, bar_h, "act")
        f.text(x_bar + w + 8, y + 18, f"{per_tok / 1024:g} KiB", size=13, anchor="start", bold=True)
        total = per_tok * S * B / 2**30
        f.text(796, y + 18, f"{a}/{n_kv} 头 · {total:g} GiB", size=12, anchor="end", color=MUTED)
    f.text(796, top - 10, f"查询/键值头 · S = {S}，B = {B}", size=12, anchor="end", color=MUTED)
    return [f]
