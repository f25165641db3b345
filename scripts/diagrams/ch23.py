"""Chapter 23: online distillation, a frozen teacher that only runs forward next to a trained student.

Left: data flow; the teacher runs under eval() + no_grad(), so its logits carry no graph and the
backward pass stops there. Right: bytes per parameter, student (FP32 + AdamW: 16) versus teacher
(FP32 4, BF16 2, INT8 weights about 1), and the chapter's example computed from parameter counts:
a BF16 GPT-2 XL teacher next to a GPT-2 small student.
"""
from __future__ import annotations

from diagrams.svg import MUTED, PALETTE, Figure

TEACHER_N = 1_557_611_200      # GPT-2 XL
STUDENT_N = 124_439_808        # GPT-2 small
ROWS = [("学生（FP32 + AdamW）", [("参数", 4, "param"), ("梯度", 4, "grad"), ("m", 4, "optim"), ("v", 4, "optim")]),
        ("教师 FP32", [("参数", 4, "param")]),
        ("教师 BF16", [("参数", 2, "param")]),
        ("教师 INT8（下限）", [("", 1, "param")])]


def draw() -> list[Figure]:
    f = Figure("ch23-teacher-student", "在线蒸馏的数据流：教师在 no_grad 下只做前向，梯度只回到学生；以及学生与教师每个参数占的字节",
               "左：同一批输入分别进入冻结的教师和训练中的学生，两份 logits 算 KL，反向只经过学生。"
               "右：学生每个参数 16 字节，教师只存参数，2–4 字节；BF16 的 GPT-2 XL 教师约 2970.9 MiB，"
               "GPT-2 small 学生的模型状态约 1898.8 MiB（算术）。",
               820, 380)
    grad = PALETTE["grad"][1]
    f.text(210, 30, "一个蒸馏步（教师 eval() + no_grad()）", size=14, bold=True)
    f.box(20, 150, 76, 40, "输入", "neutral")
    f.box(130, 62, 140, 52, "教师（冻结）", "param", size=14, sub="只做前向")
    f.box(130, 226, 140, 52, "学生（训练）", "param", size=14, sub="前向 + 反向")
    f.box(300, 68, 104, 40, "教师 logits", "act", size=12)
    f.box(300, 232, 104, 40, "学生 logits", "act", size=12)
    f.box(300, 150, 104, 40, "KL 损失", "temp", size=13)
    f.arrow(96, 162, 128, 96)
    f.arrow(96, 178, 128, 244)
    f.arrow(270, 88, 298, 88)
    f.arrow(270, 252, 298, 252)
    f.arrow(352, 108, 352, 148)
    f.arrow(340, 232, 340, 192)
    f.arrow(376, 192, 376, 230, color=grad, dash=True)
    f.path("M 300 262 L 272 262", color=grad, dash=True, arrow=True)
    f.text(410, 216, "反向", size=12, anchor="start", color=grad)
    f.text(360, 126, "没有 grad_fn：", size=12, anchor="start", color=MUTED)
    f.text(360, 142, "反向到此为止", size=12, anchor="start", color=MUTED)
    f.text(210, 312, "若教师不在 no_grad 下，还会多出：", size=12, color=MUTED)
    f.text(210, 330, "教师各层为反向保存的激活值 + 教师梯度（FP32 时 4N_t 字节）", size=12, color=MUTED)

    # --- right: bytes per parameter ---
    x0, px, top = 556, 14, 70
    f.text(660, 30, "每个参数占多少字节", size=14, bold=True)
    for r, (label, segs) in enumerate(ROWS):
        y = top + r * 40
        f.text(x0 - 8, y + 19, label, size=12, anchor="end")
        x = x0
        for name, nbytes, role in segs:
            f.box(x, y + 4, nbytes * px, 24, name if nbytes * px >= 28 else "", role, size=12)
            x += nbytes * px
        f.text(x + 6, y + 20, f"{sum(b for _, b, _ in segs)}", size=13, anchor="start", bold=True)
    y = top + len(ROWS) * 40 + 24
    f.text(660, y, "例：GPT-2 XL（BF16）教 GPT-2 small", size=13, bold=True)
    f.text(660, y + 22, f"教师参数 {TEACHER_N * 2 / 2**20:.1f} MiB", size=13)
    f.text(660, y + 42, f"学生模型状态 {STUDENT_N * 16 / 2**20:.1f} MiB", size=13)
    f.text(660, y + 64, f"参数量是学生的 {TEACHER_N / STUDENT_N:.1f} 倍，显存只是 {TEACHER_N * 2 / (STUDENT_N * 16):.2f} 倍", size=12, color=MUTED)
    return [f]
