"""One house style for the chapters' diagrams: a tiny SVG builder.

Every diagram is drawn by code (scripts/diagrams/chNN.py, `draw() -> list[Figure]`) so that a
quantitative figure (a schedule, a partition, a timeline) is computed, not hand-placed, and stays
true when numbers change. `python scripts/draw_diagrams.py` writes docs/assets/figures/*.svg;
tests/test_figures.py fails when a committed file differs from what the code draws.

House style: the palette below, the reader's CJK sans-serif, Chinese labels, a light rounded
panel as background so the figure reads the same in Material's light and dark schemes (an <img>
cannot see the page's colour toggle), a <title> and <desc> for screen readers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

FONT = "'Noto Sans CJK SC','Source Han Sans SC','PingFang SC','Microsoft YaHei',sans-serif"
MONO = "'DejaVu Sans Mono','Noto Sans Mono CJK SC',monospace"

# Role -> (fill, stroke). Use roles, not raw colours, so one chapter's "激活值" is another's.
PALETTE = {
    "param":      ("#dbe7f6", "#4a6fa5"),   # 参数 / 权重
    "grad":       ("#fde4cf", "#c46a2b"),   # 梯度
    "optim":      ("#e6dcf3", "#7a54a8"),   # 优化器状态
    "act":        ("#dcefd6", "#4f8a3c"),   # 激活值
    "temp":       ("#f6efc9", "#a58a1e"),   # 临时缓冲 / workspace
    "free":       ("#f1f1f1", "#9a9a9a"),   # 空闲 / 缓存但未用
    "host":       ("#e3edf0", "#5d7f8a"),   # 主机内存 / CPU
    "comm":       ("#f8d9de", "#b0455a"),   # 通信
    "idle":       ("#ffffff", "#c8c8c8"),   # 气泡 / 空转
    "neutral":    ("#ffffff", "#7a8ca3"),
}
INK = "#222222"       # text
MUTED = "#666666"     # secondary text
PANEL = "#fbfcfe"     # background panel
EDGE = "#555555"      # arrows and axes


@dataclass
class Figure:
    """One SVG file: `name` is the file stem (chNN-what), `title` doubles as the alt text."""
    name: str
    title: str
    desc: str
    width: int
    height: int
    body: list[str] = field(default_factory=list)

    # --- primitives -------------------------------------------------------------------------
    def rect(self, x, y, w, h, role="neutral", rx=4, dash=False, opacity=None):
        fill, stroke = PALETTE[role]
        extra = ' stroke-dasharray="4,3"' if dash else ""
        if opacity is not None:
            extra += f' fill-opacity="{opacity}"'
        self.body.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" rx="{rx}" '
                         f'fill="{fill}" stroke="{stroke}"{extra}/>')

    def text(self, x, y, s, size=13, anchor="middle", bold=False, color=INK, mono=False):
        weight = ' font-weight="bold"' if bold else ""
        family = f' font-family="{MONO}"' if mono else ""
        self.body.append(f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}" '
                         f'fill="{color}"{weight}{family}>{escape(str(s))}</text>')

    def box(self, x, y, w, h, label, role="neutral", size=13, bold=False, sub=None):
        """A rectangle with a centred label (and an optional smaller second line)."""
        self.rect(x, y, w, h, role)
        if sub is None:
            self.text(x + w / 2, y + h / 2 + size * 0.35, label, size=size, bold=bold)
        else:
            self.text(x + w / 2, y + h / 2 - 2, label, size=size, bold=bold)
            self.text(x + w / 2, y + h / 2 + size, sub, size=max(12, size - 2), color=MUTED)

    def line(self, x1, y1, x2, y2, color=EDGE, width=1.5, dash=False, arrow=False):
        extra = ' stroke-dasharray="5,4"' if dash else ""
        extra += ' marker-end="url(#arrow)"' if arrow else ""
        self.body.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{color}" '
                         f'stroke-width="{width}"{extra}/>')

    def arrow(self, x1, y1, x2, y2, **kw):
        self.line(x1, y1, x2, y2, arrow=True, **kw)

    def path(self, d, color=EDGE, width=1.5, fill="none", arrow=False, dash=False):
        extra = ' marker-end="url(#arrow)"' if arrow else ""
        extra += ' stroke-dasharray="5,4"' if dash else ""
        self.body.append(f'<path d="{d}" fill="{fill}" stroke="{color}" stroke-width="{width}"{extra}/>')

    def legend(self, x, y, roles_labels, size=12, step=None):
        """A row of colour swatches: [(role, label), ...]."""
        step = step or 0
        cx = x
        for role, label in roles_labels:
            self.rect(cx, y - 10, 14, 14, role, rx=2)
            self.text(cx + 20, y + 2, label, size=size, anchor="start")
            cx += (step or 34 + len(label) * size)

    # --- output -----------------------------------------------------------------------------
    def svg(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}" font-family="{FONT}" font-size="13" '
                f'role="img" aria-labelledby="t d">\n'
                f'<title id="t">{escape(self.title)}</title>\n<desc id="d">{escape(self.desc)}</desc>\n'
                f'<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{EDGE}"/>'
                f'</marker></defs>\n'
                f'<rect x="0.5" y="0.5" width="{self.width - 1}" height="{self.height - 1}" rx="10" '
                f'fill="{PANEL}" stroke="#d5dbe3"/>\n')
        return head + "\n".join(self.body) + "\n</svg>\n"

    def markdown(self) -> str:
        """What a chapter writes to show it (the `vl-figure` class gives the caption and dark-mode style)."""
        return f'![{self.title}](../assets/figures/{self.name}.svg){{ .vl-diagram }}'


def _n(v) -> str:
    """Coordinates rounded to 0.1 px: stable text, so the freshness test compares files byte for byte."""
    r = round(float(v), 1)
    return str(int(r)) if r == int(r) else str(r)
