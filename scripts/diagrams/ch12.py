"""Ch12: two reference chains that keep activations alive after you thought they were gone.

(a) `total += out.loss` in an eval loop: total's grad_fn chain reaches every step's loss and its saved
activations (34.02 MiB per step in the tutorial: tiny GPT-2, b8 s128). (b) An exception inside `except`:
e -> __traceback__ -> the failing frame -> its locals; the tutorial reads 110.6 MiB allocated inside the
except block and 34.3 MiB after it (128 MiB simulated card, torch 2.13.0+cpu, 2026-11-29).
"""
from diagrams.svg import MUTED, Figure

A = 34.02                          # MiB of saved activations per eval step
IN_EXCEPT, AFTER = 110.6, 34.3     # MiB allocated


def draw():
    W, H = 780, 300
    f = Figure("ch12-reference-chains", "两条拉住激活值的引用链：累加带计算图的 loss，以及 except 里的异常回溯",
               f"左：total 是带 grad_fn 的张量，经一串加法节点引用每一步的 loss 和它保存的激活值，每步多占约 {A} MiB；"
               f"右：except 块里的异常经回溯引用出错时的栈帧和它的局部变量，教程里 except 内已分配 {IN_EXCEPT} MiB，离开 except 后回到 {AFTER} MiB。", W, H)
    f.text(20, 24, "(a) 评估循环里 total += out.loss", anchor="start", bold=True)
    f.box(20, 44, 112, 44, "total", "neutral", sub="带 grad_fn 的张量", size=14)
    prev = 132
    for i in range(3):
        x, k = 150 + i * 108, 3 - i
        f.arrow(prev + 2, 66, x - 2, 66)
        f.box(x, 48, 76, 36, f"加法 {k}", "neutral", size=13)
        f.arrow(x + 38, 84, x + 38, 114)
        f.box(x - 15, 116, 106, 58, f"第 {k} 步 loss", "act", sub=f"激活值 {A} MiB", size=14)
        prev = x + 76
    f.text(20, 130, "引用链上", anchor="start", size=12, color=MUTED)
    f.text(20, 148, "谁都没释放", anchor="start", size=12, color=MUTED)
    f.box(20, 198, 422, 48, "修法：total += out.loss.item()", "free", sub="只存 Python 数；或整个循环放进 no_grad / inference_mode", size=14)
    f.text(20, 272, f"每步多占 {A} MiB（tiny GPT-2，b8 s128，模拟设备）", anchor="start", size=12, color=MUTED)
    x0 = 480
    f.text(x0, 24, "(b) except 块里的异常", anchor="start", bold=True)
    chain = [("except ... as e:", "neutral"), ("e.__traceback__", "neutral"), ("出错时的栈帧（前向内部）", "neutral"),
             ("局部变量：已算出的激活值", "act")]
    for i, (label, role) in enumerate(chain):
        y = 40 + i * 44
        f.box(x0, y, 280, 32, label, role, size=13)
        if i:
            f.arrow(x0 + 140, y - 11, x0 + 140, y - 1)
    f.box(x0, 220, 280, 48, "修法：恢复代码放到 except 外面", "free", sub="要留信息就存 str(e)，不存异常对象", size=14)
    f.text(x0, 290, f"已分配：except 内 {IN_EXCEPT} MiB，离开后 {AFTER} MiB", anchor="start", size=12,
           color=MUTED)
    return [f]
