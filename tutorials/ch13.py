# %% [markdown]
# # 第 13 章 动手实践：找出放得下、跑得稳的最大批大小
#
# 这份教程配合[第 13 章 Batch Size 调优](ch13.md)。我们用 `vramlab` 回答六个问题：
#
# 1. 峰值显存和批大小是什么关系？能不能用一条直线 $\text{峰值} \approx \text{静态部分} + b \times \text{每个样本的激活值}$ 描述？
# 2. GPT-2 small 上，模拟设备能不能重现 H200 实测的批大小 4、8、16、32 四行？两条直线的斜率和截距各是多少？
# 3. 为什么“第一步跑通了”不等于“放得下”？（第一步陷阱）
# 4. 怎样用“倍增 + 二分”自动找出一张卡能稳定训练的最大批大小？试探只跑 1 步会怎样？
# 5. 训练中途遇到 OOM，怎样自动减半微批次、保持等效批大小不变，继续训练？
# 6. 序列长短不一时，按“样本数”组批和按“token 数”组批，峰值有什么不同？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。`vramlab.device_budget("144 MiB")` 把设备变成一张只有 144 MiB 的“虚拟显卡”：放不下时抛出和 CUDA 一样的 `torch.OutOfMemoryError`。第 1、4、5、6 节用真实张量训练 2 层的 `tiny` GPT-2；第 2、3 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行。

# %%
import datetime
import functools
import gc

import matplotlib
import numpy as np
import torch
import transformers

import vramlab
from vramlab.meter import measure_steps
from vramlab.display import banner, pad
from vramlab.models import build_model, count_params
from vramlab.reference import reference_rows
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB
from vramlab.workload import from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU                              # 第 2、3 节：模拟设备上用 FakeTensorMode
BACKEND = "cuda" if ON_GPU else "sim"
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)


def fit_line(xs, ys):
    """最小二乘直线 y = slope * x + intercept。"""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)

# %% [markdown]
# ## 1. 峰值与批大小：一条直线
#
# 用 `tiny` 模型（FP32 + AdamW，序列长度 64）分别以批大小 1、2、4、8、16、32 训练。测量方法与 H200 参考表相同：第 1 步单独记一个峰值（**第一步峰值**），然后重置峰值再跑 1 步（**稳态峰值**，这时 AdamW 的状态已经存在）。读的都是已分配峰值（`max_allocated`）。

# %% tags=["tiny_line"]
MODEL, T = "tiny", 64


def make_ids(batch, seq, vocab, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def train_step(model, opt, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    del loss
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure_batch(b):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = make_ids(b, T, model.config.vocab_size, dev.torch_device)
        return measure_steps(lambda: train_step(model, opt, ids), dev, warmup=1, steps=1)


tiny_bs = [1, 2, 4, 8, 16, 32]
tiny = {b: measure_batch(b) for b in tiny_bs}
tiny_steady = [tiny[b].peak_bytes / MiB for b in tiny_bs]
tiny_first = [tiny[b].first_step_peak_bytes / MiB for b in tiny_bs]
t_slope, t_icpt = fit_line(tiny_bs, tiny_steady)

print(f"模型 {MODEL}（{count_params(MODEL):,} 个参数），FP32 + AdamW，序列长度 {T}\n")
print(pad("批大小", 10) + pad("第一步峰值 MiB", 18) + pad("稳态峰值 MiB", 16) + pad("直线预测 MiB", 16) + "差")
for b, f, s in zip(tiny_bs, tiny_first, tiny_steady):
    pred = t_icpt + t_slope * b
    print(pad(str(b), 10) + pad(f"{f:.1f}", 18) + pad(f"{s:.1f}", 16) + pad(f"{pred:.1f}", 16) + f"{s - pred:+.1f}")
print(f"\n拟合：稳态峰值 ≈ {t_icpt:.1f} MiB + b × {t_slope:.2f} MiB")
if tiny[8].breakdown:
    bd = {k: v / MiB for k, v in tiny[8].breakdown.items()}
    static = bd["parameters"] + bd["gradients"] + bd["optimizer_state"] + bd["cuda_overhead"]
    print(f"批大小 8 峰值时刻的静态部分：参数 {bd['parameters']:.1f} + 梯度 {bd['gradients']:.1f} + "
          f"AdamW 状态 {bd['optimizer_state']:.1f} + cuBLAS 工作区 {bd['cuda_overhead']:.1f} = {static:.1f} MiB")
    publish("tiny_static_mib", static, fmt="{:.1f}")
    publish("tiny_adam_state_mib", bd["optimizer_state"], fmt="{:.1f}")
    publish("tiny_icpt_minus_static_mib", round(t_icpt, 1) - round(static, 1), fmt="{:.1f}")
publish("tiny_icpt_mib", t_icpt, fmt="{:.1f}")
publish("tiny_slope_mib", t_slope, fmt="{:.2f}")

# %% [markdown]
# 六个点几乎落在一条直线上：截距就是与批大小无关的静态部分，斜率是**每多一个样本要多付的激活值**。`tiny` 的参数只有 59 万个，静态部分的大头是 cuBLAS 的两块工作区（前向、反向各 32 MiB）；峰值出现在前向刚结束、反向刚开始的时候，上一步的梯度已被 `zero_grad(set_to_none=True)` 释放，所以梯度一栏是 0（[第 5 章](ch05.md)解释过）。
#
# ## 2. GPT-2 small：重现 H200 的四行
#
# H200 参考表（`vramlab/data/h200_gpt2_peaks.md`，PyTorch 2.11.0+cu130，2026-11-29）里 GPT-2 small、FP32 + AdamW、序列长度 512 有批大小 4、8、16、32 四行。同样的配置在本机上再测一遍：模拟设备上用 FakeTensorMode，有 GPU 时在真卡上测（显存不够的行会报 OOM）。

# %%
REF = {r.name: r for r in reference_rows()}     # H200 参考表，同一个文件
H200 = {b: (REF[f"small_fp32_adamw_b{b}_s512"].steady_mib, REF[f"small_fp32_adamw_b{b}_s512"].first_step_mib)
        for b in (4, 8, 16, 32)}                # 稳态、第一步，MiB

small = {}
print("GPT-2 small，FP32 + AdamW，序列长度 512，已分配峰值（MiB）\n")
print(pad("批大小", 8) + pad("本机稳态", 12) + pad("H200 稳态", 12) + pad("偏差", 10)
      + pad("本机第一步", 12) + pad("H200 第一步", 12) + "稳态 − 第一步（本机）")
for b, (h_steady, h_first) in H200.items():
    w = from_reference_name(f"small_fp32_adamw_b{b}_s512")
    try:
        m = measure_workload(w, backend=BACKEND, fake=FAKE, steps=1)
    except torch.OutOfMemoryError:
        print(pad(str(b), 8) + "OOM（这张卡放不下）")
        continue
    small[b] = m
    s, f = m.peak_bytes / MiB, m.first_step_peak_bytes / MiB
    print(pad(str(b), 8) + pad(f"{s:.0f}", 12) + pad(str(h_steady), 12) + pad(f"{s / h_steady - 1:+.2%}", 10)
          + pad(f"{f:.0f}", 12) + pad(str(h_first), 12) + f"{s - f:.0f}")

h_slope, h_icpt = fit_line(list(H200), [v[0] for v in H200.values()])
print(f"\nH200 实测拟合：稳态峰值 ≈ {h_icpt:.0f} MiB + b × {h_slope:.1f} MiB")
if len(small) >= 2:
    s_slope, s_icpt = fit_line(list(small), [m.peak_bytes / MiB for m in small.values()])
    print(f"本机测量拟合：稳态峰值 ≈ {s_icpt:.0f} MiB + b × {s_slope:.1f} MiB")
    publish("sim_slope_mib", s_slope, fmt="{:.1f}")
    publish("sim_slope_int", round(s_slope))
    publish("sim_slope_times8_mib", 8 * round(s_slope))
    publish("sim_icpt_mib", s_icpt, fmt="{:.0f}")
for b, m in small.items():
    publish(f"sim_b{b}_steady_mib", m.peak_bytes / MiB, fmt="{:.0f}")
devs = [m.peak_bytes / MiB / H200[b][0] - 1 for b, m in small.items()]
firsts = [round(m.first_step_peak_bytes / MiB) - H200[b][1] for b, m in small.items()]
publish("sim_dev_min", min(devs), fmt="{:.2%}")
publish("sim_dev_max", max(devs), fmt="{:.2%}")
publish("sim_dev_abs_max", max(abs(d) for d in devs), fmt="{:.2%}")
publish("sim_first_dev_min_mib", f"{min(firsts):+d}".replace("-", "−"))
publish("sim_first_dev_max_mib", f"{max(firsts):+d}".replace("-", "−"))

n = count_params("gpt2-small")
print(f"\n算术：FP32 参数 {n * 4 / MiB:.1f} MiB + AdamW 两个矩 {n * 8 / MiB:.1f} MiB + cuBLAS 工作区 64 MiB "
      f"= {(n * 12) / MiB + 64:.1f} MiB")
if 8 in small and small[8].breakdown:
    bd = {k: v / MiB for k, v in small[8].breakdown.items()}
    names = {"parameters": "参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
             "temporaries": "临时张量", "cuda_overhead": "cuBLAS 工作区"}
    print("本机批大小 8 峰值时刻：" + "，".join(f"{names.get(k, k)} {v:.0f}" for k, v in bd.items() if v >= 0.5)
          + "（MiB）")
    publish("sim_b8_activations_mib", bd["activations"], fmt="{:.0f}")
    publish("sim_b8_temporaries_mib", bd["temporaries"], fmt="{:.0f}")
    publish("sim_b8_act_plus_temp_mib", round(bd["activations"]) + round(bd["temporaries"]))
publish("param_fp32_mib", n * 4 / MiB, fmt="{:.1f}")
publish("adam_state_mib", n * 8 / MiB, fmt="{:.1f}")
publish("bf16_copy_mib", n * 2 / MiB, fmt="{:.1f}")
publish("static_sum_mib", round(n * 4 / MiB, 1) + round(n * 8 / MiB, 1) + 64, fmt="{:.1f}")

# %% [markdown]
# 正文“批大小与显存的关系”一节对 H200 的四行做的算术也在这里算好发布（最小二乘拟合、残差、两点斜率、吞吐量，以及激活检查点和 BF16 autocast 两行的斜率与截距）：

# %% tags=["h200_fit"]
bs = np.array(list(H200), float)
ms = np.array([v[0] for v in H200.values()], float)
sxy, sxx = float(((bs - bs.mean()) * (ms - ms.mean())).sum()), float(((bs - bs.mean()) ** 2).sum())
slope = round(sxy / sxx, 1)
icpt = round(ms.mean() - bs.mean() * slope)
print(f"b̄ = {bs.mean():g}，M̄ = {ms.mean():g} MiB，Σ(b−b̄)(M−M̄) = {sxy:g}，Σ(b−b̄)² = {sxx:g}")
print(f"斜率 {sxy / sxx:.2f} MiB/样本，截距 {ms.mean() - bs.mean() * sxy / sxx:.1f} MiB")
publish("h200_mean_b", f"{bs.mean():g}")
publish("h200_mean_m", f"{ms.mean():g}")
publish("h200_sxy", f"{sxy:g}")
publish("h200_sxx", f"{sxx:g}")
publish("h200_slope_mib", slope, fmt="{:.1f}")
publish("h200_icpt_mib", icpt)
resid = [int(round(m - (ms.mean() + sxy / sxx * (b - bs.mean())))) for b, m in zip(bs, ms)]    # 与最小二乘直线的差
print("残差（MiB）：", resid, f"最大占峰值 {max(abs(r) / m for r, m in zip(resid, ms)):.2%}")
publish("h200_resid_max_share", max(abs(r) / m for r, m in zip(resid, ms)), fmt="{:.2%}")
for b, r in zip(H200, resid):
    publish(f"h200_resid_b{b}", f"{r:+d}".replace("-", "−"))
publish("h200_two_point_slope_mib", (H200[32][0] - H200[4][0]) / 28, fmt="{:.1f}")
publish("h200_icpt_minus_static_mib", icpt - round(round(n * 4 / MiB, 1) + round(n * 8 / MiB, 1) + 64))
for b, (st, fi) in H200.items():
    publish(f"h200_b{b}_steady_mib", st)
    publish(f"h200_b{b}_first_mib", fi)
    publish(f"h200_b{b}_diff_mib", st - fi)
    publish(f"h200_b{b}_step_ms", REF[f"small_fp32_adamw_b{b}_s512"].step_ms, fmt="{:.1f}")
    publish(f"h200_b{b}_samples_per_s", b / REF[f"small_fp32_adamw_b{b}_s512"].step_ms * 1000, fmt="{:.0f}")
diffs = [st - fi for st, fi in H200.values()]
publish("h200_diff_min_mib", min(diffs))
publish("h200_diff_max_mib", max(diffs))
publish("h200_b8_to_b32_peak_ratio", H200[32][0] / H200[8][0], fmt="{:.1f}")
tput = {b: b / REF[f"small_fp32_adamw_b{b}_s512"].step_ms for b in H200}
publish("h200_b8_to_b32_tput_gain", tput[32] / tput[8] - 1, fmt="{:.0%}")
acc = REF["small_fp32_adamw_b8x4accum_s512"]
publish("h200_accum_step_ms", acc.step_ms, fmt="{:.1f}")
publish("h200_accum_samples_per_s", 32 / acc.step_ms * 1000, fmt="{:.0f}")
publish("h200_accum_steady_mib", acc.steady_mib)
# 每个 token 的激活值与序列 128 的预测（SDPA）
per_token = round(slope / 512, 3)
publish("h200_per_token_mib", per_token, fmt="{:.3f}")
publish("h200_pred_b8_s128_mib", icpt + 1024 * per_token, fmt="{:.0f}")
publish("h200_b8_s128_mib", REF["small_fp32_adamw_b8_s128"].steady_mib)
publish("h200_b8_s1024_mib", REF["small_fp32_adamw_b8_s1024"].steady_mib)
# 两点（b8、b32）的斜率和截距：FP32、激活检查点、BF16 autocast
lines = {}
for key, fmt_name in (("fp32", "small_fp32_adamw_b{}_s512"), ("ckpt", "small_fp32_adamw_b{}_s512_ckpt"),
                      ("bf16", "small_bf16autocast_adamw_b{}_s512")):
    m8, m32 = REF[fmt_name.format(8)].steady_mib, REF[fmt_name.format(32)].steady_mib
    sl = round((m32 - m8) / 24, 1)
    ic = round(m8 - 8 * sl)
    lines[key] = (sl, ic)
    print(f"{key:5s} b8 {m8} MiB，b32 {m32} MiB，斜率 {sl} MiB/样本，截距 {ic} MiB")
    publish(f"two_point_{key}_b8_mib", m8)
    publish(f"two_point_{key}_b32_mib", m32)
    publish(f"two_point_{key}_slope_mib", sl, fmt="{:.1f}")
    publish(f"two_point_{key}_icpt_mib", ic)
publish("ckpt_slope_share", lines["ckpt"][0] / lines["fp32"][0], fmt="{:.0%}")
publish("bf16_slope_cut", 1 - lines["bf16"][0] / lines["fp32"][0], fmt="{:.0%}")
publish("bf16_icpt_extra_mib", lines["bf16"][1] - lines["fp32"][1])
publish("fp32_icpt_minus_static_mib", lines["fp32"][1] - (round(n * 4 / MiB, 1) + round(n * 8 / MiB, 1) + 64), fmt="{:.0f}")
# 最大批大小的算术例子：C = 20000 MiB，留 10%（H = 2000 MiB）
publish("bmax_fp32", int((18000 - icpt) // slope))
publish("bmax_fp32_exact", (18000 - icpt) / slope, fmt="{:.2f}")
publish("bmax_ckpt", int((18000 - lines["ckpt"][1]) // lines["ckpt"][0]))
publish("bmax_budget_left_mib", 18000 - icpt)
per_sample_256 = round(256 * per_token, 1)
publish("per_sample_s256_mib", per_sample_256, fmt="{:.1f}")
publish("bmax_s256", int((18000 - icpt) // per_sample_256))

# %% [markdown]
# 两条直线的斜率都约 800 MiB/样本，截距约 1500 MiB，和“参数 + AdamW 状态 + cuBLAS 工作区”的算术结果只差十来 MiB。稳态与第一步相差约 950–1000 MiB，几乎正好是一份 AdamW 状态（每个参数两个 FP32 矩，8 字节）：AdamW 在第一次 `step()` 时才创建状态，第一步的峰值里没有它。
#
# 把两组数据画在一起：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")},
             key=lambda name: "SC" not in name)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
ax = axes[0]
xs = np.linspace(0, max(tiny_bs), 50)
ax.plot(tiny_bs, tiny_steady, "o", label="稳态 steady")
ax.plot(tiny_bs, tiny_first, "s", mfc="none", label="第一步 first step")
ax.plot(xs, t_icpt + t_slope * xs, "-", lw=1, label=f"拟合 {t_icpt:.0f} + {t_slope:.2f}·b")
ax.set_title(f"tiny，序列 {T}（{'GPU' if ON_GPU else '模拟设备 sim'}）")
ax.set_xlabel("批大小 batch size b")
ax.set_ylabel("已分配峰值 peak allocated (MiB)")
ax.legend(fontsize=8)

ax = axes[1]
hb = list(H200)
xs = np.linspace(0, max(hb), 50)
ax.plot(hb, [v[0] for v in H200.values()], "o", ms=8, label="H200 稳态 steady")
ax.plot(hb, [v[1] for v in H200.values()], "s", ms=8, mfc="none", label="H200 第一步 first step")
if small:
    ax.plot(list(small), [m.peak_bytes / MiB for m in small.values()], "x", color="k",
            label=("本机 GPU" if ON_GPU else "模拟设备 sim") + " 稳态")
ax.plot(xs, h_icpt + h_slope * xs, "-", lw=1, label=f"H200 拟合 {h_icpt:.0f} + {h_slope:.0f}·b")
ax.set_title("GPT-2 small，FP32 + AdamW，序列 512")
ax.set_xlabel("批大小 batch size b")
ax.set_ylabel("已分配峰值 peak allocated (MiB)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. 第一步陷阱：第 1 步放得下，第 2 步 OOM
#
# 按 H200 的数字，GPT-2 small 批大小 16 的第一步峰值是 13369 MiB，稳态是 14320 MiB。如果一张卡留给 PyTorch 的正好是 14000 MiB，会发生什么？用 `vramlab.device_budget("14000 MiB")` 造一张这样的虚拟显卡试试（有 GPU 时，它用 `torch.cuda.set_per_process_memory_fraction` 给真卡设同样的上限）。
#
# 顺便观察另一件事：**在 `except` 块里，显存还没有释放**。异常对象的回溯（traceback）引用着出错时的各层栈帧，栈帧又引用着前向留下的激活值；离开 `except` 块后它们才被释放。

# %% tags=["trap"]
def first_step_trap(batch=16, budget="14000 MiB", steps=3):
    with vramlab.device_budget(budget, fake=FAKE) as dev:
        model = build_model("gpt2-small", device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = make_ids(batch, 512, 50257, dev.torch_device)
        for step in range(1, steps + 1):
            dev.reset_peak()
            oom = False
            try:
                train_step(model, opt, ids)
            except torch.OutOfMemoryError as e:
                oom = True
                inside = dev.allocated()               # 还在 except 块里
                first_line = str(e).split(" GPU 0")[0]
            if not oom:
                print(f"第 {step} 步：通过，峰值 {dev.max_allocated() / MiB:.0f} MiB")
                publish(f"trap_step{step}_peak_mib", dev.max_allocated() / MiB, fmt="{:.0f}")
                continue
            outside = dev.allocated()                  # 已经离开 except 块
            opt.zero_grad(set_to_none=True)
            gc.collect()
            dev.empty_cache()
            print(f"第 {step} 步：OOM —— {first_line}")
            print(f"  except 块里的已分配显存：{inside / MiB:.0f} MiB")
            print(f"  离开 except 块之后：     {outside / MiB:.0f} MiB（参数 + AdamW 状态 + cuBLAS 工作区）")
            print(f"  清理后已保留显存：       {dev.reserved() / MiB:.0f} MiB")
            publish("trap_oom_step", step)
            publish("trap_inside_mib", inside / MiB, fmt="{:.0f}")
            publish("trap_outside_mib", outside / MiB, fmt="{:.0f}")
            publish("trap_reserved_mib", dev.reserved() / MiB, fmt="{:.0f}")
            break


first_step_trap()

# %% [markdown]
# 第 1 步顺利通过，于是你以为批大小 16 没问题；第 2 步一开始 AdamW 状态已经常驻，同样的前向、反向就差了这几百 MiB。**试探批大小时至少要跑 2 步**（Lightning 的 `BatchSizeFinder` 默认每个批大小跑 3 步）。
#
# 另外注意，异常之后 `empty_cache()` 也没能把已保留显存降到已分配的水平：缓存里有些段还被常驻张量占着一部分，整段还不回去。这就是碎片，下一次分配能不能成功，看的不只是“已分配”的数字。
#
# ## 4. 自动寻找最大批大小：倍增 + 二分
#
# 思路和 Lightning `BatchSizeFinder` 的 `binsearch` 模式相同：从 1 开始每次翻倍，直到第一次 OOM；然后在“最后一个成功”和“第一个失败”之间二分。每次试探都在一张**全新的**虚拟显卡上、用全新的模型和优化器从头训练，相当于“用这个批大小重新启动训练”，所以试探之间互不影响。
#
# 虚拟显卡 144 MiB，`tiny` 模型，序列长度 64，真实张量。每次试探跑 2 步，记下在第几步 OOM；“只试 1 步”的搜索只看第 1 步的结果（第 1 步的结果与后面跑不跑无关，所以两种搜索可以共用试探结果，省一半时间）。

# %% tags=["search"]
CARD = "144 MiB"


@functools.cache
def trial(b, steps=2):
    """在全新的虚拟显卡上用批大小 b 训练 steps 步。返回 (在第几步 OOM，None 表示都通过；已分配峰值 MiB)。"""
    with vramlab.device_budget(CARD) as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = make_ids(b, T, model.config.vocab_size, dev.torch_device)
        failed = None
        for step in range(1, steps + 1):
            try:
                train_step(model, opt, ids)
            except torch.OutOfMemoryError:
                failed = step
                break
        peak = dev.max_allocated() / MiB
        del model, opt, ids
        gc.collect()
        dev.empty_cache()
        return failed, peak


def find_max_batch(fits, start=1, limit=4096):
    """倍增直到 OOM，再在 (最后成功, 第一次失败) 之间二分。fits(b) -> bool。返回 (最大批大小, 试探记录)。"""
    trace = []

    def probe(b):
        ok = fits(b)
        trace.append((b, ok))
        return ok

    lo, hi, b = 0, None, start
    while b <= limit:                    # 第一阶段：倍增
        if probe(b):
            lo, b = b, b * 2
        else:
            hi = b
            break
    if hi is None or lo == 0:            # 到了上限都放得下，或者连 start 都放不下
        return lo, trace
    while hi - lo > 1:                   # 第二阶段：二分
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, trace


def fits_after(steps):
    def fits(b):
        failed, _ = trial(b)
        return failed is None or failed > steps
    return fits


results, traces = {}, {}
for steps in (1, 2):
    best, trace = find_max_batch(fits_after(steps))
    results[steps] = best
    traces[steps] = trace
    print(f"每次试探跑 {steps} 步：找到的最大批大小 = {best}")
    for i, (b, ok) in enumerate(trace, 1):
        failed, peak = trial(b)
        shown = "通过" if ok else f"OOM（第 {failed} 步）"
        print(f"  试探 {i:2d}：b = {b:<4d} {pad(shown, 16)} 已分配峰值 {peak:6.1f} MiB")
    print()
publish("search_naive", results[1])
publish("search_safe", results[2])
publish("search_safe_trials", len(traces[2]))
publish("search_safe_order", "、".join(str(b) for b, _ in traces[2]))
diverge = next(i for i, (a, b) in enumerate(zip(traces[1], traces[2])) if a != b)
publish("search_diverge_trial", diverge + 1)
publish("search_diverge_b", traces[2][diverge][0])

# %% [markdown]
# 两种搜索的前六次试探一样，分歧出在第 7 次、批大小 24：它第 1 步放得下、第 2 步放不下。只跑 1 步的搜索把它当成“通过”，最后给出一个更大的答案。拿这个答案去真正训练：

# %%
naive, safe = results[1], results[2]
for b in (naive, safe):
    failed, peak = trial(b, steps=3)
    verdict = "3 步都通过" if failed is None else f"第 {failed} 步 OOM"
    print(f"批大小 {b}：训练 3 步 → {verdict}（已分配峰值 {peak:.1f} MiB）")
    publish(f"verify_{'naive' if b == naive else 'safe'}_verdict", verdict)

# %% [markdown]
# `tiny` 的参数太少，AdamW 状态只有 4.5 MiB；这里第一步与稳态的差主要来自反向线程的 cuBLAS 工作区（32 MiB，第一次反向矩阵乘法时才分配，见 `vramlab/sim/device.py` 的说明）。GPT-2 small 上差的主要是 AdamW 状态（约 950 MiB，第 3 节）。两者是同一类问题：**有些显存要到训练跑起来之后才出现**。
#
# 搜索本身还可以更省：第 1 节的直线告诉我们，两次测量就能预测最大批大小，再用一两次试探确认。

# %%
card_mib = 144
pred = int((card_mib - t_icpt) // t_slope)
print(f"直线预测：({card_mib} − {t_icpt:.1f}) / {t_slope:.2f} = {(card_mib - t_icpt) / t_slope:.1f} → {pred}")
print(f"搜索结果（每次 2 步）：{safe}")
publish("line_pred_b", pred)

# %% [markdown]
# 预测比搜索结果偏大：直线只描述**已分配**显存，而虚拟显卡（和真卡一样）限制的是缓存分配器**已保留**的显存，块的取整和碎片要多占一些。所以预测只能当作搜索的起点，最终以实测为准，并且留出余量。
#
# ## 5. 训练中途 OOM：自动减半微批次，等效批大小不变
#
# 数据的序列长度变化时，前面放得下的微批次，遇到一批长序列就可能 OOM。下面的训练循环固定**等效批大小**（每次更新 32 个样本），遇到 OOM 时：
#
# 1. 在 `except` 块里只做记录，**离开 `except` 块之后**再清理；
# 2. 清理：丢掉局部变量里的损失（它拉着整张计算图）、`zero_grad(set_to_none=True)` 丢掉这一步已经累积的一部分梯度、`gc.collect()`、`empty_cache()`；
# 3. 微批次减半、累积步数加倍，**重做这一整步**；
# 4. 连续成功 `grow_every` 步后，试着把微批次翻倍长回去（类似混合精度里 `GradScaler` 的增长间隔）。

# %% tags=["backoff"]
def train_with_backoff(lengths, global_batch=32, micro=32, grow_every=2, card=CARD):
    log = []
    with vramlab.device_budget(card) as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        streak = 0
        for step, seq in enumerate(lengths, 1):
            ids = make_ids(global_batch, seq, model.config.vocab_size, dev.torch_device, seed=step)
            while True:
                dev.reset_peak()
                oom, loss = False, None
                try:
                    for chunk in ids.split(micro):
                        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / global_batch)
                        loss.backward()
                        loss = None
                    opt.step()
                except torch.OutOfMemoryError:
                    oom = True
                if not oom:
                    break
                loss = chunk = None                   # 离开 except 块之后再清理
                opt.zero_grad(set_to_none=True)
                gc.collect()
                dev.empty_cache()
                log.append((step, seq, micro, global_batch // micro, "OOM，微批次减半后重做"))
                if micro == 1:
                    raise RuntimeError("批大小 1 也放不下：需要第 6、7 章的方法减少每个样本的显存")
                micro //= 2
                streak = 0
            opt.zero_grad(set_to_none=True)
            log.append((step, seq, micro, global_batch // micro, f"通过，峰值 {dev.max_allocated() / MiB:.1f} MiB"))
            streak += 1
            if streak >= grow_every and micro < global_batch:
                micro, streak = micro * 2, 0          # 试着长回去
    return log


print(pad("步", 6) + pad("序列长度", 10) + pad("微批次", 8) + pad("累积步数", 10) + "结果")
for step, seq, micro, accum, what in train_with_backoff([32, 64, 128, 32, 32, 32, 32, 32]):
    print(pad(str(step), 6) + pad(str(seq), 10) + pad(str(micro), 8) + pad(str(accum), 10) + what)

# %% [markdown]
# 每一步的等效批大小都是 32（微批次 × 累积步数），学习率不用改；代价是 OOM 的那一次尝试白算了，微批次变小后每步也更慢。长回去的规则让训练在短序列上重新用大微批次，但每次“长回去”都可能再 OOM 一次，所以 `grow_every` 不宜太小。
#
# ## 6. 按 token 数组批：让每一批的峰值差不多
#
# 激活值正比于批里的 **token 数**（样本数 × 补齐后的长度），而不是样本数。48 条长短不一的序列，比较两种组批方式：
#
# - **固定批大小**：随机顺序，每 8 条一批，补齐（padding）到这一批里最长的那条；
# - **token 预算**：按长度排序，贪心装批，保证“条数 × 这一批最长的长度”不超过 1024 个 token（fairseq 的 `--max-tokens` 就是这样组批的）。
#
# 补齐位置的标签设为 `-100`，不参与损失。每一批都在同一个设备上训练一步，读这一步的已分配峰值。

# %%
rng = np.random.default_rng(0)
lengths = np.clip(rng.lognormal(mean=4.0, sigma=0.7, size=48).astype(int), 8, 256).tolist()


def fixed_batches(lengths, batch_size=8, seed=0):
    order = np.random.default_rng(seed).permutation(len(lengths)).tolist()
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def token_budget_batches(lengths, max_tokens=1024):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])   # 长的在前
    batches, cur = [], []
    for i in order:
        longest = max([lengths[j] for j in cur] + [lengths[i]])
        if cur and (len(cur) + 1) * longest > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def collate(idx, lengths, vocab, device):
    longest = max(lengths[i] for i in idx)
    g = torch.Generator().manual_seed(sum(idx))
    ids = torch.randint(0, vocab, (len(idx), longest), generator=g)
    labels = ids.clone()
    for row, i in enumerate(idx):
        labels[row, lengths[i]:] = -100                # 补齐的位置不算损失
    return ids.to(device), labels.to(device)


def run_batches(batches):
    rows = []
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        train_step(model, opt, make_ids(2, 16, model.config.vocab_size, dev.torch_device))  # 热身：创建 AdamW 状态
        for idx in batches:
            ids, labels = collate(idx, lengths, model.config.vocab_size, dev.torch_device)
            dev.reset_peak()
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            real = sum(lengths[i] for i in idx)
            rows.append((len(idx), ids.shape[1], ids.numel(), real, dev.max_allocated() / MiB))
    return rows


print(f"48 条序列，长度 {min(lengths)}–{max(lengths)}，共 {sum(lengths)} 个真实 token\n")
summary = {}
for name, batches in [("固定批大小 8", fixed_batches(lengths)), ("token 预算 1024", token_budget_batches(lengths))]:
    rows = run_batches(batches)
    summary[name] = rows
    print(f"{name}：{len(rows)} 批")
    print("  " + pad("条数", 6) + pad("补齐长度", 10) + pad("补齐后 token", 14) + pad("补齐占比", 10) + "已分配峰值 MiB")
    for count, longest, padded, real, peak in rows:
        print("  " + pad(str(count), 6) + pad(str(longest), 10) + pad(str(padded), 14)
              + pad(f"{1 - real / padded:.0%}", 10) + f"{peak:.1f}")
    padded_all = sum(r[2] for r in rows)
    peaks = [r[4] for r in rows]
    print(f"  合计补齐后 {padded_all} 个 token（补齐占 {1 - sum(lengths) / padded_all:.0%}）；"
          f"峰值最低 {min(peaks):.1f}、最高 {max(peaks):.1f} MiB\n")
    key = "fixed" if name.startswith("固定") else "budget"
    publish(f"{key}_batches", len(rows))
    publish(f"{key}_pad_share", 1 - sum(lengths) / padded_all, fmt="{:.0%}")
    publish(f"{key}_peak_min_mib", min(peaks), fmt="{:.1f}")
    publish(f"{key}_peak_max_mib", max(peaks), fmt="{:.1f}")
publish("len_min", min(lengths))
publish("len_max", max(lengths))

# %%
fig, ax = plt.subplots(figsize=(9, 3.2))
for k, (name, rows) in enumerate(summary.items()):
    ax.bar(np.arange(len(rows)) + 0.4 * k, [r[4] for r in rows], width=0.4, label=name)
ax.set_xlabel("批的序号 batch index")
ax.set_ylabel("已分配峰值 peak (MiB)")
ax.set_title("每一批训练一步的峰值 / peak per batch")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 固定批大小时，每一批的峰值由这一批里**最长的那条序列**决定，最坏的一批决定了会不会 OOM；按 token 预算组批，每一批补齐后的 token 数都不超过预算，峰值被压在一条线以下，补齐浪费也少得多。代价是每一批的**样本数**不再固定：损失要按 token 数归一化（见[第 5 章](ch05.md)的 `num_items_in_batch`），学习率的“批大小”也应按 token 数来理解。
#
# ## 小结
#
# - 峰值 ≈ 静态部分 + 批大小 × 每个样本的激活值：两三次测量就能拟合出这条直线，用来预测和规划。
# - 第一步的峰值偏低（AdamW 状态、反向的 cuBLAS 工作区都是后来才有的），试探至少跑 2 步。
# - 倍增 + 二分能在十来次试探内找到最大批大小；OOM 之后先离开 `except` 块、丢掉所有引用再清理。
# - 训练中途 OOM 时减半微批次、加倍累积步数，等效批大小和学习率都不变。
# - 序列长短不一时按 token 预算组批，峰值更平稳、补齐更少。
