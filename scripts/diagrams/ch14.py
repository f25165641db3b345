"""Ch14: FlashAttention's tiling: one block row of queries streams K/V blocks through SRAM, never writing S or P.

Grid: an 8 x 8 block view of the causal s x s score matrix (upper blocks skipped, the diagonal masked
element-wise). The saved-tensor sizes are computed from the chapter's formulas for GPT-2 small,
b = 8, s = 512, a = 12: eager keeps P, 4abs^2 bytes per layer (96 MiB); FlashAttention keeps the
log-sum-exp, 4abs bytes (192 KiB).
"""
from diagrams.svg import EDGE, MUTED, Figure

NB, ROW, COL = 8, 5, 3                 # blocks per side; the query block row and K/V block being processed
B, S, A = 8, 512, 12


def draw():
    p_mib = 4 * A * B * S * S / 2**20
    lse_kib = 4 * A * B * S / 2**10
    W, H, gx, gy, c = 780, 318, 70, 62, 24
    f = Figure("ch14-flash-tiling", "FlashAttention 的分块：一块查询依次读入各块键和值，分数块只在片上 SRAM 里出现",
               "左边是因果注意力的分数矩阵按块划分：右上方的块整块跳过，对角线上的块逐元素屏蔽；第 i 块查询依次与各块键、值算出小分数块，"
               f"在 SRAM 里在线更新每行的最大值、指数和与输出，最后只把输出和 log-sum-exp 写回显存。GPT-2 small（批大小 8，序列 512）"
               f"每层 eager 要存 {p_mib:.0f} MiB 的概率矩阵，FlashAttention 只存 {lse_kib:.0f} KiB。", W, H)
    f.text(gx + NB * c / 2, 30, "分数矩阵 S（s × s，按块）", bold=True)
    f.text(gx + NB * c / 2, 50, "键、值块 j →", size=12, color=MUTED)
    for i in range(NB):
        for j in range(NB):
            x, y = gx + j * c, gy + i * c
            if j > i:
                f.rect(x, y, c - 2, c - 2, "idle", rx=1, dash=True)
            elif i == ROW and j == COL:
                f.rect(x, y, c - 2, c - 2, "temp", rx=1)
            elif i == ROW and j < COL:
                f.rect(x, y, c - 2, c - 2, "act", rx=1)
            else:
                f.rect(x, y, c - 2, c - 2, "free", rx=1)
            if i == j:
                f.line(x + 2, y + 2, x + c - 4, y + c - 4, color=MUTED, width=1)
    f.text(gx - 8, gy + ROW * c + 16, "查询块 i", anchor="end", size=12, bold=True)
    f.text(gx - 8, gy + 16, "i ↓", anchor="end", size=12, color=MUTED)
    f.text(gx, gy + NB * c + 18, "虚线：整块跳过　斜线：对角块逐元素屏蔽", anchor="start", size=12, color=MUTED)
    f.text(gx, gy + NB * c + 36, "绿色：这一行已处理的块", anchor="start", size=12, color=MUTED)
    tile_x, tile_y = gx + COL * c + c / 2, gy + ROW * c + c / 2
    sx, sy = 330, 96
    f.rect(sx, sy, 210, 136, "temp", rx=8)
    f.text(sx + 105, sy + 22, "片上 SRAM", bold=True)
    f.text(sx + 105, sy + 46, "S_ij = Q_i K_j^T / √d", size=12)
    f.text(sx + 105, sy + 66, "（B_r × B_c 的小块）", size=12)
    f.text(sx + 105, sy + 88, "每行在线更新 m、ℓ、õ", size=12)
    f.text(sx + 105, sy + 110, "读完：o = õ / ℓ，lse = m + log ℓ", size=12)
    f.arrow(tile_x + 10, tile_y - 4, sx - 4, sy + 68, color=EDGE)
    hx = 586
    f.rect(hx, sy, 178, 136, "param", rx=8)
    f.text(hx + 90, sy + 22, "写回显存（HBM）", bold=True)
    f.text(hx + 90, sy + 50, "输出 O_i [B_r, d]", size=12)
    f.text(hx + 90, sy + 72, "lse_i [B_r]", size=12)
    f.text(hx + 90, sy + 108, "S、P 从不写回", size=12, bold=True)
    f.arrow(sx + 212, sy + 68, hx - 4, sy + 68, color=EDGE)
    f.text(sx, 258, f"为反向保存（每层，批大小 {B}、序列 {S}、{A} 个头）：", anchor="start", size=12)
    f.text(sx, 280, f"eager：概率矩阵 P，4abs² 字节 = {p_mib:.0f} MiB", anchor="start", size=13)
    f.text(sx, 302, f"FlashAttention：log-sum-exp，4abs 字节 = {lse_kib:.0f} KiB（反向重算 P）", anchor="start", size=13)
    return [f]
