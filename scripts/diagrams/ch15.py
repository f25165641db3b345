"""Ch15: chunked cross-entropy: never materialise the full [b*s, V] logits, one [c, V] chunk at a time.

Sizes are computed for the chapter's setting, GPT-2 small b = 8, s = 512, V = 50257, FP32, chunk c = 1024:
three full-size tensors live at the peak without chunking (log_softmax output, NLL grad, log_softmax grad,
3 * b*s*V*4 bytes = 2355.8 MiB); chunked, one [c, V] block (196.3 MiB) exists at a time, recomputed in
backward. Rectangle heights are proportional to the number of tokens.
"""
import math

from diagrams.svg import INK, MUTED, Figure

B, S, V, CHUNK = 8, 512, 50257, 1024


def draw():
    full = B * S * V * 4 / 2**20
    part = CHUNK * V * 4 / 2**20
    n_chunks = math.ceil(B * (S - 1) / CHUNK)          # positions 0..s-2 predict the next token
    W, H, top, hpx = 780, 300, 56, 170
    f = Figure("ch15-chunked-ce", "分块交叉熵：不再同时物化三块完整的 logits 大小张量",
               f"不分块时，峰值里同时有三块 [b·s, V] 的 FP32 张量，GPT-2 small（批大小 8、序列 512）每块 {full:.1f} MiB，共 {3 * full:.1f} MiB；"
               f"分块后每次只算 {CHUNK} 个 token 的 logits（{part:.1f} MiB），用检查点在反向时重算，同一时刻只有一块的 logits 及其梯度活着。", W, H)
    f.text(190, 28, f"不分块：峰值时刻三块 [{B * S}, {V}]", bold=True)
    labels = [("act", "log_softmax", "输出（激活值）"), ("temp", "nll_loss", "的梯度（临时张量）"),
              ("temp", "log_softmax", "的梯度（临时张量）")]
    for k, (role, name, kind) in enumerate(labels):
        x = 24 + k * 122
        f.rect(x, top, 114, hpx, role, rx=3)
        f.text(x + 57, top + hpx / 2 - 8, name, size=12, mono=True)
        f.text(x + 57, top + hpx / 2 + 12, kind, size=12)
        f.text(x + 57, top + hpx + 18, f"{full:.1f} MiB", size=12)
    f.text(190, top + hpx + 44, f"合计 {3 * full:.1f} MiB（b·s·V·4 字节 × 3）", bold=True)
    x0 = 420
    f.text(x0 + 170, 28, f"分块：{B * (S - 1)} 个预测位置，每块 {CHUNK} 个，共 {n_chunks} 块", bold=True)
    f.text(x0 + 40, top - 8, "隐藏状态 h", size=12, color=MUTED)
    n_tok = B * (S - 1)
    px_tok = hpx / (B * S)
    f.rect(x0 + 20, top, 40, n_tok * px_tok, "act", rx=3)
    for i in range(n_chunks):
        y, hc = top + i * CHUNK * px_tok, min(CHUNK, n_tok - i * CHUNK) * px_tok
        f.line(x0 + 20, y, x0 + 60, y, width=1)
        f.arrow(x0 + 64, y + hc / 2, x0 + 128, y + hc / 2)
        f.rect(x0 + 132, y + 2, 100, hc - 4, "temp" if i == 1 else "idle", rx=3, dash=i != 1)
        label = f"[{CHUNK}, {V}]" if i == 1 else ("已算完" if i < 1 else "待算")
        f.text(x0 + 182, y + hc / 2 + 4, label, size=12, color=INK if i == 1 else MUTED)
    f.text(x0 + 96, top - 8, "乘 W^T", size=12, color=MUTED)
    f.text(x0 + 182, top - 8, "这一块的 logits", size=12, color=MUTED)
    yi = top + 1.5 * CHUNK * px_tok
    f.text(x0 + 244, yi - 10, f"{part:.1f} MiB", anchor="start", bold=True)
    f.text(x0 + 244, yi + 10, "前向算完就丢，", anchor="start", size=12)
    f.text(x0 + 244, yi + 28, "反向时重算", anchor="start", size=12)
    f.text(x0 + 170, top + hpx + 44, "同一时刻只有一块的 logits 及其梯度", bold=True)
    f.text(W - 16, H - 10, f"GPT-2 small，b = {B}，s = {S}，V = {V}，FP32；高度按 token 数成比例", anchor="end",
           size=12, color=MUTED)
    return [f]
