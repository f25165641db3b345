"""Ch06: bytes per parameter of the model states under four precision set-ups (the chapter's table).

Segments are the chapter's per-parameter bytes (ZeRO paper's accounting for classic mixed precision);
autocast adds a 16-bit weight copy that lives only from forward to backward (dashed). The right column
multiplies by N = 7e9 parameters (decimal GB), as the chapter does for the 7B example.
"""
from diagrams.svg import MUTED, Figure

N = 7e9
ROWS = [  # label, [(role, text, bytes, transient)]
    ("全 FP32", [("param", "参数", 4), ("grad", "梯度", 4), ("optim", "m", 4), ("optim", "v", 4)]),
    ("经典混合精度", [("param", "参数", 2), ("grad", "梯度", 2), ("optim", "主权重", 4), ("optim", "m", 4), ("optim", "v", 4)]),
    ("PyTorch autocast", [("param", "参数=主权重", 4), ("grad", "梯度", 4), ("optim", "m", 4), ("optim", "v", 4),
                          ("temp", "副本", 2)]),
    ("纯 BF16", [("param", "参数", 2), ("grad", "梯度", 2), ("optim", "m", 2), ("optim", "v", 2)]),
]


def draw():
    W, x0, top, row, px = 820, 130, 40, 50, 26
    H = top + row * len(ROWS) + 40
    f = Figure("ch06-bytes-per-param", "四种精度做法每个参数的模型状态：混合精度并不比全 FP32 省",
               "全 FP32、经典混合精度和 PyTorch autocast 的模型状态都是每参数 16 字节（autocast 还在前向到反向之间多一份 2 字节的 16 位权重副本）；"
               "只有纯 BF16 降到 8 字节。右栏按 70 亿参数算出总量。", W, H)
    f.text(x0, 24, "每个参数的模型状态（长度按字节数成比例）", anchor="start", size=12, color=MUTED)
    f.text(W - 16, 24, f"× {N / 1e9:.0f}B 参数", anchor="end", size=12, color=MUTED)
    for i, (label, parts) in enumerate(ROWS):
        y, x = top + i * row, x0
        f.text(x0 - 10, y + 23, label, anchor="end", bold=True)
        for role, text, nbytes, *_ in parts:
            transient = role == "temp"
            f.rect(x, y + 4, nbytes * px - 2, 28, role, rx=2, dash=transient)
            f.text(x + nbytes * px / 2 - 1, y + 23, f"{text} {nbytes}", size=12)
            x += nbytes * px
        kept = sum(p[2] for p in parts if p[0] != "temp")
        extra = sum(p[2] for p in parts if p[0] == "temp")
        total = f"{kept} 字节" + (f"（+{extra}）" if extra else "")
        gb = f"{kept * N / 1e9:.0f} GB" + (f"（+{extra * N / 1e9:.0f}）" if extra else "")
        f.text(x0 + 18 * px + 14, y + 23, total, anchor="start", bold=True)
        f.text(W - 16, y + 23, gb, anchor="end")
    f.legend(x0, H - 16, [("param", "参数"), ("grad", "梯度"), ("optim", "优化器状态（含主权重）"),
                          ("temp", "16 位权重副本：只活在前向到反向之间")])
    return [f]
