"""Ch05: one optimizer update by gradient accumulation, k = 4 micro-batches of a batch B = 16.

Rows share one time axis (forward 1 unit, backward 2 units per micro-batch): the compute, the activations
that are alive (one micro-batch at a time), what .grad holds after each backward (j/k of the full-batch
gradient, since each loss is scaled by b_j / B), and DDP's communication (no_sync() until the last one).
"""
from diagrams.svg import MUTED, Figure

BATCH, K = 16, 4
TF, TB, U = 1, 2, 44                     # time units and px per unit


def draw():
    b = BATCH // K
    W, H, x0 = 780, 292, 124
    f = Figure("ch05-accumulation", f"梯度累积：批大小 {BATCH} 拆成 {K} 个微批次，梯度在 .grad 里加够 {K} 次才更新一次",
               f"每个微批次的损失乘以 b_j/B = {b}/{BATCH} 再反向，.grad 依次攒到整批梯度的 1/{K}、2/{K}……；同一时刻只有一个微批次的激活值，"
               f"但梯度从第一个微批次的反向起一直常驻到 step()。DDP 下前 {K - 1} 个微批次放进 no_sync()，只在最后一次反向时全规约。", W, H)
    rows = [("计算", 44), ("活着的激活值", 92), (".grad 里的梯度", 140), ("DDP 通信", 196)]
    for name, y in rows:
        f.text(x0 - 12, y + 20, name, anchor="end", bold=True)
    t = 0
    for j in range(K):
        xf, xb = x0 + t * U, x0 + (t + TF) * U
        f.box(xf, 44, TF * U - 2, 30, f"前{j + 1}", "param", size=12)
        f.box(xb, 44, TB * U - 2, 30, f"反{j + 1}", "grad", size=12)
        f.rect(xf, 92, (TF + TB) * U - 2, 30, "act", rx=3)
        f.text(xf + (TF + TB) * U / 2, 112, f"微批次 {j + 1}（{b} 个样本）", size=12)
        level = (j + 1) / K
        f.rect(xb + TB * U - 18, 170 - 40 * level, 16, 40 * level, "grad", rx=1)
        f.text(xb + TB * U - 22, 166, f"{j + 1}/{K}", anchor="end", size=12, color=MUTED)
        if j < K - 1:
            f.rect(xf, 196, (TF + TB) * U - 2, 30, "idle", rx=3, dash=True)
            f.text(xf + (TF + TB) * U / 2, 216, "no_sync()", size=12, mono=True, color=MUTED)
        else:
            f.box(xb, 196, TB * U - 2, 30, "全规约", "comm", size=12)
        t += TF + TB
    f.text(x0, 34, f"每次反向：(loss × b_j/B).backward()，这里 b_j/B = {b}/{BATCH}", anchor="start", size=12)
    xs = x0 + t * U
    f.box(xs + 4, 44, 98, 30, "step()", "optim", size=13)
    f.box(xs + 4, 140, 98, 30, "zero_grad", "free", size=12)
    f.text(xs + 53, 186, "梯度释放", size=12, color=MUTED)
    f.text(x0, 262, f"∇L = Σ_j (b_j / B) × 微批次 j 的平均梯度：backward() 把梯度加到 .grad 上，{K} 次之后就是整批梯度",
           anchor="start", size=12)
    f.text(x0, 282, "时间轴示意：每个微批次前向 1 个单位、反向 2 个单位", anchor="start", size=12, color=MUTED)
    return [f]
