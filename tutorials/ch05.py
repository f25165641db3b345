# %% [markdown]
# # 第 5 章 动手实践：梯度累积省了什么、没省什么
#
# 这份教程配合[第 5 章 梯度累积技术](ch05.md)。我们用 `vramlab` 回答五个问题：
#
# 1. 同样是一次更新 16 个样本，直接算、4 × 4 累积、2 × 8 累积，峰值显存各是多少？梯度是不是真的一样？
# 2. 峰值时刻显存里都是什么？“峰值 ≈ 静态部分 + 一个微批次的激活值”对不对？
# 3. GPT-2 small 上用累积撑起批大小 32，模拟设备的读数和 H200 实测对得上吗？
# 4. 每个微批次的 token 数不一样时，损失该怎么缩放？梯度裁剪放在哪里？
# 5. 批归一化（BatchNorm）为什么让梯度累积“不再等价”？换成 GroupNorm / LayerNorm、冻结统计量又如何？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 1、2 节用真实张量训练 2 层的 `tiny` GPT-2；第 3 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）几秒就能“跑”完。第 4、5 节只比较数值，不涉及显存，直接在 CPU（或 GPU）上算。

# %%
import datetime

import matplotlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

import vramlab
from vramlab.meter import measure_steps
from vramlab.display import banner, pad
from vramlab.models import build_model, count_params
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU          # 第 3 节：模拟设备上用 FakeTensorMode
PLAIN = torch.device("cuda" if ON_GPU else "cpu")   # 第 4、5 节只比数值，不统计显存
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)


def tex(x, digits=2):
    """正文公式里的写法：够大的数照常写（digits 位有效数字），很小的写成 a × 10^n。"""
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.{digits}g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa} \\times 10^{{{int(exponent)}}}"

# %% [markdown]
# ## 1. 一次更新 16 个样本：直接算 vs. 累积
#
# `train_step` 把一个批次切成若干微批次（micro-batch），逐个前向、反向，梯度在 `.grad` 里累加，最后只做一次 `optimizer.step()`。每个微批次的损失乘以它在整批中所占的比例（`len(chunk) / B`）：Hugging Face 的语言模型损失是对 token 取平均的，这样累加出来的梯度才等于整批一起算的梯度。`micro = 16` 就是不累积。
#
# 测量方法与 H200 参考表相同：第 1 步热身（AdamW 在第一次 `step()` 时才创建状态），重置峰值，再测 1 步，读**稳态已分配峰值**（`max_allocated`）。AdamW 显式用 `foreach=True`，与 GPU 上的默认实现一致。

# %% tags=["micro"]
MODEL, B, T = "tiny", 16, 128


def make_batch(vocab, device):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (B, T), generator=g).to(device)


def train_step(model, optimizer, batch, micro):
    """一次参数更新；micro 是微批次大小（= len(batch) 时就是不累积）。返回整批的平均损失。"""
    n, total = batch.shape[0], 0.0
    for chunk in batch.split(micro):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        loss.backward()                # 梯度累加进 .grad
        total += loss.item()           # 只留一个 Python float，不留计算图
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def peak_of(micro):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        batch = make_batch(model.config.vocab_size, dev.torch_device)
        train_step(model, opt, batch, micro)                  # 热身：AdamW 在这里创建状态
        start = len(dev.snapshot()["timeline"])               # 测量步从时间线的这里开始
        m = measure_steps(lambda: train_step(model, opt, batch, micro), dev, warmup=0, steps=1)
    m.timeline = m.timeline[start:]
    return m


runs = {}
for micro in (16, 8, 4):
    runs[micro] = peak_of(micro)

base = runs[16].peak_bytes
print(f"模型 {MODEL}（{count_params(MODEL):,} 个参数），FP32 + AdamW，每次更新 {B} 个样本 × 序列长度 {T}\n")
print(pad("做法", 14) + pad("微批次", 10) + pad("累积步数", 10) + pad("稳态峰值 MiB", 16) + "相对直接算")
for micro, m in runs.items():
    name = "直接算" if micro == B else f"累积 {B // micro} × {micro}"
    print(pad(name, 14) + pad(str(micro), 10) + pad(str(B // micro), 10)
          + pad(f"{m.peak_bytes / MiB:.1f}", 16) + f"{m.peak_bytes / base:.0%}")
    publish(f"tiny_peak_{micro}_mib", m.peak_bytes / MiB, fmt="{:.1f}")
    publish(f"tiny_peak_{micro}_share", m.peak_bytes / base, fmt="{:.0%}")

# %% [markdown]
# 峰值随微批次变小而下降，但不是按比例下降：4 × 4 只用了四分之一的激活值，峰值却不是直接算的四分之一。原因要看峰值时刻的组成。
#
# 先确认“等效批次不变”这件事：从同一组初始权重出发，分别用三种切法算一次梯度，比较最大绝对差。这里不统计显存，直接在 CPU（或 GPU）上算。

# %%
def grads_of(micro, seed=0):
    model = build_model(MODEL, device=PLAIN, seed=seed)
    batch = make_batch(model.config.vocab_size, PLAIN)
    for chunk in batch.split(micro):
        (model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / B)).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def max_abs_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


ref = grads_of(16)
ref_max = max(g.abs().max().item() for g in ref.values())
print(f"直接算的梯度，最大绝对值 {ref_max:.3e}")
publish("grad_max_abs", tex(ref_max))
diffs = {}
for micro in (8, 4):
    diffs[micro] = max_abs_diff(ref, grads_of(micro))
    print(f"累积 {B // micro} × {micro} 与直接算：梯度最大绝对差 {diffs[micro]:.3e}")
    publish(f"grad_diff_{micro}", tex(diffs[micro], 4))
publish("grad_diff_max", tex(max(diffs.values()), 4))
publish("grad_diff_max_short", tex(max(diffs.values())))

# %% [markdown]
# 差值在 FP32 的舍入误差量级（加法顺序不同），梯度是同一个梯度。
#
# ## 2. 峰值时刻显存里是什么
#
# 模拟设备能告诉我们峰值那一刻每个字节属于哪一类（真 GPU 上的分配器不知道张量的用途，这张表只在模拟设备上有）。把参数、梯度、优化器状态和 cuBLAS 工作区（`cuda_overhead`：前向、反向各 32 MiB）算作“静态部分”，激活值和临时张量算作“随微批次变化的部分”：

# %% tags=["breakdown"]
STATIC = ("parameters", "gradients", "optimizer_state", "cuda_overhead")
DYNAMIC = ("activations", "temporaries")
if runs[16].breakdown:
    cols = ["参数", "梯度", "优化器状态", "cuBLAS", "激活值", "临时张量", "静态合计", "动态合计"]
    print(pad("MiB", 12) + "".join(pad(c, 12) for c in cols))
    for micro, m in runs.items():
        b = {k: v / MiB for k, v in m.breakdown.items()}
        name = "直接算" if micro == B else f"累积 {B // micro}×{micro}"
        vals = [b["parameters"], b["gradients"], b["optimizer_state"], b["cuda_overhead"], b["activations"],
                b["temporaries"], sum(b[k] for k in STATIC), sum(b[k] for k in DYNAMIC)]
        print(pad(name, 12) + "".join(pad(f"{v:.1f}", 12) for v in vals))
    d16 = sum(runs[16].breakdown[k] for k in DYNAMIC)
    for micro in (8, 4):
        d = sum(runs[micro].breakdown[k] for k in DYNAMIC)
        print(f"\n微批次 {micro}：动态部分是直接算的 {d / d16:.1%}（微批次占比 {micro / B:.0%}）", end="")
        publish(f"dynamic_share_{micro}", d / d16, fmt="{:.1%}")
    print()
    static4 = sum(runs[4].breakdown[k] for k in STATIC)
    publish("static_4_mib", static4 / MiB, fmt="{:.1f}")
    publish("static_4_share", static4 / runs[16].peak_bytes, fmt="{:.0%}")
    publish("cublas_each_mib", runs[16].breakdown["cuda_overhead"] / 2 / MiB, fmt="{:.0f}")
else:
    print("真 GPU 上没有按类别的分解；见正文里模拟设备的结果。")

# %% [markdown]
# 两点值得注意：
#
# - **动态部分（激活值 + 临时张量）跟着微批次走**：8 个样本约是 16 个的一半，4 个约是四分之一。
# - **梯度在累积时一直占着显存**。直接算时，峰值出现在前向刚结束、反向刚开始的时刻，那时 `.grad` 还没有分配（上一步用 `zero_grad(set_to_none=True)` 释放了），所以梯度一栏是 0；累积时，从第二个微批次起，前面累加的梯度必须留在 `.grad` 里，峰值就包含一整份梯度。梯度显存不会因为累积而变小，反而在峰值时刻多出一份。
#
# 所以 $\text{峰值} \approx \text{静态部分} + \text{激活值}(\text{微批次})$，累积只能压缩第二项。
#
# 下面画出一次更新中已分配显存随分配/释放事件的变化（热身之后测量的那一步；真 GPU 上没有逐次分配的时间线，图会是空的）。直接算是一个大峰，最高点在前向结束、反向开始之处；4 × 4 是四个矮峰，每个微批次的前向把激活值堆起来，反向再把它们释放。峰与峰之间回落到静态部分，其中从第一次反向起多了常驻的梯度（`tiny` 的梯度只有 2.3 MiB，图上几乎看不出来；GPT-2 small 上是 479 MiB，见第 3 节）。

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")}, key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False


def step_timeline(m):
    return [e["allocated"] for e in m.timeline]      # peak_of() 已经只留下测量的那一步


fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
for ax, micro, title in [(axes[0], 16, "直接算 batch 16 / direct"), (axes[1], 4, "累积 4 × 4 / accumulation")]:
    tl = step_timeline(runs[micro])
    if not tl:
        ax.text(0.5, 0.5, "no timeline on this backend", ha="center", transform=ax.transAxes)
        continue
    ax.plot([v / MiB for v in tl], lw=1.2)
    ax.axhline(runs[micro].peak_bytes / MiB, ls="--", lw=0.8, color="gray")
    ax.set_title(f"{title}：峰值 {runs[micro].peak_bytes / MiB:.0f} MiB")
    ax.set_xlabel("分配/释放事件序号 (allocation event)")
axes[0].set_ylabel("已分配显存 allocated (MiB)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. GPT-2 small：用累积撑起批大小 32
#
# H200 参考表（`vramlab/data/h200_gpt2_peaks.md`，PyTorch 2.11.0+cu130）里有三行正好回答“累积值不值”：批大小 8 直接算、批大小 32 直接算、4 个微批次 × 8 累积（等效批大小 32）。同样的三种做法在本机上再测一遍：模拟设备上用 FakeTensorMode，有 GPU 时在真卡上测。

# %% tags=["gpt2"]
def gpt2_small_peak(batch, micro, seq=512):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = build_model("gpt2-small", device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, 50257, (batch, seq), device=dev.torch_device)

        def step():
            for chunk in ids.split(micro):
                loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch)
                loss.backward()
                del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        return measure_steps(step, dev, warmup=1, steps=1)


from vramlab.reference import reference_rows

REF = {r.name: r for r in reference_rows()}      # H200 参考表（vramlab/data/h200_gpt2_peaks.md）
ROWS = {(8, 8): "small_fp32_adamw_b8_s512", (16, 16): "small_fp32_adamw_b16_s512",
        (32, 32): "small_fp32_adamw_b32_s512", (32, 8): "small_fp32_adamw_b8x4accum_s512"}
H200 = {k: REF[ROWS[k]].steady_mib for k in ((8, 8), (32, 32), (32, 8))}     # MiB，稳态 max_memory_allocated
print("GPT-2 small，FP32 + AdamW，序列长度 512，稳态已分配峰值\n")
print(pad("配置", 26) + pad("本机 MiB", 12) + pad("H200 实测 MiB", 16) + "偏差")
small = {}
for (batch, micro), h in H200.items():
    name = f"批大小 {batch} 直接算" if batch == micro else f"累积 {batch // micro} × {micro}（等效 {batch}）"
    try:
        m = gpt2_small_peak(batch, micro)
    except torch.OutOfMemoryError:                     # 显存小于约 27 GiB 的卡放不下批大小 32 直接算
        print(pad(name, 26) + "OOM（这张卡放不下）")
        continue
    small[(batch, micro)] = m
    print(pad(name, 26) + pad(f"{m.peak_bytes / MiB:.0f}", 12) + pad(str(h), 16) + f"{m.peak_bytes / MiB / h - 1:+.1%}")
if small:
    publish("small_max_deviation", max(abs(m.peak_bytes / MiB / H200[k] - 1) for k, m in small.items()), fmt="{:.2%}")

n_small = count_params("gpt2-small")
print(f"\nGPT-2 small 的 FP32 梯度：{n_small:,} × 4 字节 = {n_small * 4 / MiB:.1f} MiB")
publish("small_grad_mib", n_small * 4 / MiB, fmt="{:.1f}")
if (8, 8) in small and (32, 8) in small:
    print(f"累积 4×8 比批大小 8 直接算多出：{(small[(32, 8)].peak_bytes - small[(8, 8)].peak_bytes) / MiB:.0f} MiB")
    publish("small_accum_extra_mib", (small[(32, 8)].peak_bytes - small[(8, 8)].peak_bytes) / MiB, fmt="{:.0f}")
if (32, 8) in small and small[(32, 8)].breakdown:
    print(f"累积 4×8 峰值时刻的梯度：{small[(32, 8)].breakdown['gradients'] / MiB:.0f} MiB")
    publish("small_accum_grad_mib", small[(32, 8)].breakdown["gradients"] / MiB, fmt="{:.0f}")

# %% [markdown]
# 正文引用的 H200 参考数据（同一张表）和由它们算出的数也从这里发布，正文里的每个数都有同一个来处：

# %%
h = {k: REF[v] for k, v in ROWS.items()}
for (batch, micro), r in h.items():
    key = f"b{batch}" if batch == micro else "accum"
    publish(f"h200_{key}_mib", r.steady_mib)
    publish(f"h200_{key}_ms", r.step_ms, fmt="{:.1f}")
accum, b8, b16, b32 = h[(32, 8)], h[(8, 8)], h[(16, 16)], h[(32, 32)]
publish("h200_accum_vs_b32", accum.steady_mib / b32.steady_mib, fmt="{:.1%}")
publish("h200_accum_extra_mib", accum.steady_mib - b8.steady_mib)
publish("h200_accum_slower", accum.step_ms / b32.step_ms - 1, fmt="{:.1%}")
publish("h200_4x_b8_ms", 4 * b8.step_ms, fmt="{:.0f}")
publish("h200_ms_per_sample_b8", b8.step_ms / 8, fmt="{:.1f}")
publish("h200_ms_per_sample_b32", b32.step_ms / 32, fmt="{:.1f}")
diff = b32.steady_mib - b8.steady_mib
per_sample = round(diff / 24)
static = accum.steady_mib - 8 * per_sample
publish("h200_b8_b32_diff_mib", diff)
publish("h200_per_sample_mib", per_sample)
publish("h200_accum_static_mib", static)
b_max = (16384 - 1024 - static) // per_sample            # 正文的例子：16 GiB 的卡，留 1 GiB 余量
publish("example_b_max", b_max)
publish("example_k", -(-32 // b_max))
publish("example_peak_mib", static + b_max * per_sample)
publish("h200_b16_plus_grad_mib", b16.steady_mib + accum.steady_mib - b8.steady_mib)
print(f"H200：累积 4×8 {accum.steady_mib} MiB / 批大小 32 {b32.steady_mib} MiB = {accum.steady_mib / b32.steady_mib:.1%}；"
      f"每个样本约 {per_sample} MiB，静态部分约 {static} MiB，16 GiB 的卡上 b_max = {b_max}")

# %% [markdown]
# 等效批大小 32 的一次更新，累积 4 × 8 的峰值只比批大小 8 直接算高出一份梯度，而离批大小 32 直接算差得很远。这正是上一节的公式：静态部分（参数 + 梯度 + AdamW 状态）不变，激活值只看微批次。
#
# ## 4. 损失怎么缩放：token 数不同的微批次
#
# 语言模型的损失默认是“对有效 token 取平均”。如果每个微批次的有效 token 数（不是 `-100` 的标签个数）不一样，例如序列有长有短、用 padding 补齐，那么“每个微批次的平均损失 ÷ 累积步数”就**不等于**整批的平均损失：短序列所在的微批次被放大了。
#
# 正确的做法是先数出整批（所有微批次加起来）的有效 token 数 $N$，每个微批次用“损失之和 ÷ $N$”。transformers 的模型接受 `num_items_in_batch` 参数，正是为此准备的。

# %%
torch.manual_seed(0)
lm = build_model(MODEL, device=PLAIN)
ids = torch.randint(0, lm.config.vocab_size, (8, 64), device=PLAIN)
labels = ids.clone()
lengths = [64, 60, 10, 8, 64, 64, 50, 5]        # 每条序列的真实长度，其余位置是 padding
for i, L in enumerate(lengths):
    labels[i, L:] = -100
n_items = int((labels[:, 1:] != -100).sum())    # 语言模型向后错一位预测，第一个位置没有标签


def lm_grads(fn):
    fn()
    g = {k: p.grad.detach().clone() for k, p in lm.named_parameters()}
    lm.zero_grad(set_to_none=True)
    return g


def full():
    lm(input_ids=ids, labels=labels).loss.backward()


def naive():                                    # 每个微批次各自取平均，再 ÷ 累积步数
    for c_ids, c_lab in zip(ids.split(2), labels.split(2)):
        (lm(input_ids=c_ids, labels=c_lab).loss / 4).backward()


def token_weighted():                           # 所有微批次共用同一个分母：整批的有效 token 数
    for c_ids, c_lab in zip(ids.split(2), labels.split(2)):
        lm(input_ids=c_ids, labels=c_lab, num_items_in_batch=n_items).loss.backward()


def rel_err(a, b):
    num = sum(((a[k] - b[k]) ** 2).sum() for k in a) ** 0.5
    den = sum((a[k] ** 2).sum() for k in a) ** 0.5
    return (num / den).item()


g_full = lm_grads(full)
tokens = [int((c[:, 1:] != -100).sum()) for c in labels.split(2)]
print("4 个微批次（每个 2 条序列）的有效 token 数：", tokens, "，合计", n_items)
publish("tokens", "、".join(map(str, tokens)))
for name, fn, key in [("平均损失 ÷ 累积步数", naive, "naive"), ("按 token 加权（num_items_in_batch）", token_weighted, "weighted")]:
    g = lm_grads(fn)
    print(pad(name, 38) + f"最大绝对差 {max_abs_diff(g_full, g):.2e}   相对误差 {rel_err(g_full, g):.2e}")
    publish(f"loss_scale_err_{key}", tex(rel_err(g_full, g), 3))

# %% [markdown]
# “平均损失 ÷ 累积步数”的梯度与整批差了一个可观的比例；按 token 加权后回到舍入误差。每个微批次 token 数相同（例如第 1 节、评分练习里没有 padding 的定长序列）时，两种写法等价。
#
# **梯度裁剪**也要在累积完成之后做一次：裁剪看的是整批梯度的范数，对每个微批次的部分梯度分别裁剪，得到的是另一个东西。下面把 `max_norm` 设得很小，让裁剪一定生效，比较一次更新后的参数：

# %%
def params_after(micro, clip):
    model = build_model(MODEL, device=PLAIN)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = make_batch(model.config.vocab_size, PLAIN)
    for chunk in batch.split(micro):
        (model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / B)).backward()
        if clip == "每个微批次后":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
    if clip == "累积完成后一次":
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
        params_after.norm = norm.item()
    opt.step()
    return {k: p.detach().clone() for k, p in model.named_parameters()}


p_ref = params_after(16, "累积完成后一次")
print(f"整批梯度范数 {params_after.norm:.3f} > max_norm 0.05，裁剪生效")
publish("clip_norm", params_after.norm, fmt="{:.3f}")
for clip, key in (("累积完成后一次", "once"), ("每个微批次后", "each")):
    d = max_abs_diff(p_ref, params_after(4, clip))
    print(pad(f"累积 4 × 4，裁剪放在{clip}：", 40) + f"与“直接算 + 裁剪”的参数最大差 {d:.2e}")
    publish(f"clip_diff_{key}", tex(d, 3))
    publish(f"clip_diff_{key}_short", tex(d))

# %% [markdown]
# ## 5. 批归一化：统计量只看得到一个微批次
#
# 批归一化（batch normalization，BN）在训练时用**当前输入这一批**的均值和方差做归一化。累积时，每次前向只有一个微批次，BN 算出的是微批次的统计量，和整批的不一样；前向的结果变了，梯度自然也变了。所以，对含 BN 的模型，梯度累积**不等价**于大批次训练。
#
# 用一个带 `BatchNorm1d` 的小 MLP 验证：16 个样本，比较直接算与不同微批次累积的梯度。再把 BN 换成 GroupNorm、LayerNorm（它们在单个样本内部做归一化，与批大小无关），以及把 BN 切到 `eval()` 模式（冻结统计量，用 `running_mean` / `running_var`）。

# %%
def mlp(norm):
    torch.manual_seed(0)
    layer = {"BatchNorm1d": lambda: nn.BatchNorm1d(64), "GroupNorm(8)": lambda: nn.GroupNorm(8, 64),
             "LayerNorm": lambda: nn.LayerNorm(64), "BN 冻结统计量": lambda: nn.BatchNorm1d(64)}[norm]
    net = nn.Sequential(nn.Linear(32, 64), layer(), nn.ReLU(), nn.Linear(64, 64), layer(), nn.ReLU(),
                        nn.Linear(64, 10)).to(PLAIN)
    if norm == "BN 冻结统计量":
        for m in net.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.eval()                       # 用 running 统计量，不再更新它们
    return net


g = torch.Generator().manual_seed(1)
X = (torch.randn(16, 32, generator=g) * 2 + 0.5).to(PLAIN)
Y = torch.randint(0, 10, (16,), generator=g).to(PLAIN)


def mlp_grads(norm, micro):
    net = mlp(norm)
    for xb, yb in zip(X.split(micro), Y.split(micro)):
        (F.cross_entropy(net(xb), yb) * (len(xb) / len(X))).backward()
    grads = {k: p.grad.detach().clone() for k, p in net.named_parameters()}
    bn = [m for m in net.modules() if isinstance(m, nn.BatchNorm1d)]
    return grads, (bn[0].running_mean.clone() if bn else None)


print("梯度与整批直接算的相对误差\n")
print(pad("归一化层", 18) + "".join(pad(f"累积 {16 // mi}×{mi}", 14) for mi in (8, 4, 2)))
bn_stats = {}
for norm in ("BatchNorm1d", "GroupNorm(8)", "LayerNorm", "BN 冻结统计量"):
    ref_g, ref_rm = mlp_grads(norm, 16)
    row = []
    for micro in (8, 4, 2):
        gm, rm = mlp_grads(norm, micro)
        row.append(rel_err(ref_g, gm))
        if norm == "BatchNorm1d":
            bn_stats[micro] = (rm - ref_rm).abs().max().item()
    print(pad(norm, 18) + "".join(pad(f"{e:.2e}", 14) for e in row))
    key = {"BatchNorm1d": "bn", "GroupNorm(8)": "gn", "LayerNorm": "ln", "BN 冻结统计量": "bn_frozen"}[norm]
    for micro, e in zip((8, 4, 2), row):
        publish(f"norm_err_{key}_{16 // micro}x{micro}", tex(e, 3 if key == "bn" else 2))

print("\nBatchNorm1d 第一层的 running_mean：累积一次更新后与整批的最大差")
for micro, d in bn_stats.items():
    print(f"  {16 // micro} × {micro}：{d:.3e}（running_mean 被更新了 {16 // micro} 次，而不是 1 次）")
    publish(f"running_mean_diff_{16 // micro}x{micro}", d, fmt="{:.3f}")

# %% [markdown]
# 读这张表：
#
# - **BatchNorm1d**：梯度与整批不一样，微批次越小差得越多；`running_mean` 也不同，因为它按动量（默认 0.1）被每个微批次各更新一次。
# - **GroupNorm / LayerNorm**：只在样本内部归一化，累积与整批的差在舍入误差量级。
# - **冻结 BN 统计量**：`eval()` 模式下 BN 退化成一个固定的仿射变换，累积也就等价了（代价是不再用批统计量，常用于微调已经训练好的模型）。
#
# 其他选择：在多卡上用 `SyncBatchNorm` 让统计量覆盖所有卡上的微批次之和（累积步之间仍然不共享）；或者干脆让微批次大一些，使每个微批次的统计量足够稳定。正文讨论这些取舍。
#
# ## 6. 可复用的代码模板
#
# 把前面几节的结论收进一个函数：一组微批次（一个“累积窗口”）做一次更新；分母是整组的有效 token 数（多卡时是所有卡的总数）；非最后一个微批次在 `no_sync()` 里做前向和反向（只有 DDP / FSDP 包装过的模型才有这个方法）；裁剪、`optimizer.step()`、学习率调度、清零梯度都在窗口结束时各做一次。正文的“实战代码模板”一节逐行解释，这里只验证它：同一批数据，4 个微批次一组与整批一组，更新两次之后参数是否一致。

# %%
import contextlib

import torch.distributed as dist


def lm_count(batch):
    """因果语言模型的有效 token 数：标签向后错一位，-100 不计。"""
    return int((batch["labels"][:, 1:] != -100).sum())


def lm_loss(model, batch, n_items):
    """transformers 模型：用整个窗口的 token 数作分母（num_items_in_batch）。"""
    return model(**batch, num_items_in_batch=n_items).loss


def accumulation_windows(loader, accumulation_steps):
    """把微批次按 accumulation_steps 个一组交出；epoch 末尾不满一组的也交出。"""
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == accumulation_steps:
            yield window
            window = []
    if window:
        yield window


def accumulated_update(model, optimizer, window, *, loss_fn=lm_loss, count_fn=lm_count,
                       scheduler=None, max_grad_norm=None, scaler=None, autocast_dtype=None):
    """用一组微批次做一次参数更新，返回这一组的平均损失（Python float）。"""
    device = next(model.parameters()).device
    n_items = sum(count_fn(b) for b in window)            # 整组共用的分母
    world = 1
    if dist.is_available() and dist.is_initialized():     # 多卡：分母是所有卡上的总数
        t = torch.tensor(n_items, device=device)
        dist.all_reduce(t)
        n_items, world = int(t), dist.get_world_size()    # DDP 把梯度求平均（÷ world），这里乘回来
    total = 0.0
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        amp = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
               else contextlib.nullcontext())
        with sync:                                         # 前向和反向都要在 no_sync() 里
            with amp:
                loss = loss_fn(model, batch, n_items) * world
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.item() / world
        del loss                                           # 不留计算图
    if scaler is not None:
        scaler.unscale_(optimizer)                         # 先还原梯度的真实大小，再裁剪
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()                                   # 学习率按“更新次数”推进
    optimizer.zero_grad(set_to_none=True)
    return total


micro_batches = [{"input_ids": i, "labels": l} for i, l in zip(ids.split(2), labels.split(2))]
whole = [{"input_ids": ids, "labels": labels}]


def run_template(windows):
    model = build_model(MODEL, device=PLAIN)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    losses = [accumulated_update(model, opt, w, scheduler=sched, max_grad_norm=1.0) for w in windows]
    return losses, {k: p.detach().clone() for k, p in model.named_parameters()}


loss_acc, p_acc = run_template([micro_batches, micro_batches])       # 两次更新，每次 4 个微批次
loss_full, p_full = run_template([whole, whole])                     # 两次更新，每次整批
print("每次更新的平均损失（累积）:", [f"{x:.6f}" for x in loss_acc])
print("每次更新的平均损失（整批）:", [f"{x:.6f}" for x in loss_full])
print(f"两次更新后参数的最大差：{max_abs_diff(p_full, p_acc):.2e}")
print("10 个微批次、accumulation_steps = 4 时的窗口大小：",
      [len(w) for w in accumulation_windows(range(10), 4)])
publish("template_losses_acc", " 和 ".join(f"{x:.6f}" for x in loss_acc))
publish("template_losses_full", " 和 ".join(f"{x:.6f}" for x in loss_full))
publish("template_param_diff", tex(max_abs_diff(p_full, p_acc), 3))
publish("template_windows", "、".join(str(len(w)) for w in accumulation_windows(range(10), 4)))

# %% [markdown]
# 两条路径给出同样的损失和同样的参数（差在舍入误差量级）。最后一行说明 epoch 末尾不满一组时的处理：10 个微批次分成 4、4、2 三组，更新 3 次；因为分母是这一组实际的 token 数，最后那组不会被放大。
#
# ## 小结
#
# - 累积让一次更新看到的样本数不变，而峰值只由一个微批次的激活值决定；梯度、参数、优化器状态一分不少，梯度还会在峰值时刻常驻。
# - 损失要按“这个微批次在整批中的份额”缩放；token 数不同时，用整批的有效 token 数作分母。
# - 梯度裁剪、学习率调度、`optimizer.step()` 都只在累积完成后做一次。
# - 含 BN 的模型，累积不等价于大批次；换 GroupNorm / LayerNorm、冻结统计量、用 SyncBatchNorm 或加大微批次。
