# %% [markdown]
# # 第 1 章 动手实践：量一量一个训练步的显存
#
# 这份教程配合[第 1 章 显存基础认知](ch01.md)。我们用 `vramlab` 回答四个问题：
#
# 1. 模型状态（参数、梯度、优化器状态）每个参数到底占几个字节？
# 2. GPT-2 small（批大小 8、序列长度 512、FP32 + AdamW）一个训练步的峰值显存是多少，峰值时刻显存里都是什么？和 `vramlab.estimate` 的解析估算对得上吗？
# 3. 批大小、序列长度和注意力实现各让峰值涨多少？和 H200 上的实测对比如何？
# 4. 把张量在显存和主存之间搬来搬去，显存读数怎么变？
#
# 没有 GPU 时，代码在 CPU 上的**模拟设备**里运行，并打开 FakeTensorMode：张量只有形状和类型、没有数据，所以 GPT-2 small 一步几秒就能“跑”完，统计到的是 CUDA 缓存分配器会报告的已分配显存。有 NVIDIA GPU 时，同样的代码在真卡上测量（`vramlab.open_device("auto")` 会自动选择）。

# %%
import datetime
import unicodedata

import torch
import transformers

import vramlab
from vramlab.meter import measure_steps
from vramlab.models import build_model, count_params
from vramlab.display import banner
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

transformers.logging.set_verbosity_error()   # 只看我们自己打印的内容
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU          # 模拟设备上用 FakeTensorMode：只有形状，没有数据


def row(*cells, widths):
    """按显示宽度对齐一行表格（一个汉字占两格），第一列左对齐，其余右对齐。"""
    out = []
    for i, (c, w) in enumerate(zip(cells, widths)):
        c = str(c)
        pad = " " * max(w - sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in c), 0)
        out.append(c + pad if i == 0 else pad + c)
    return "".join(out)

# %% [markdown]
# ## 1. 模型状态：每个参数几个字节
#
# 先只看“持久”的那部分：参数、梯度和优化器状态。做法是跑一步训练，但 `zero_grad(set_to_none=False)`，让梯度留在显存里；然后读**当前**（不是峰值）显存的组成。输入只用 1 × 64 个 token，让激活值小到可以忽略。
#
# 注意 `torch.optim.AdamW(..., foreach=True)`：GPU 上 PyTorch 默认走 foreach（多张量）实现，CPU 上默认不走；为了让模拟设备与 GPU 上的行为一致，这里显式打开。

# %%
def model_state_bytes(dtype):
    """一步训练后，参数、梯度、优化器状态各占多少字节（当前值，不是峰值）。"""
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = build_model("gpt2-small", dtype=dtype, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, 50257, (1, 64), device=dev.torch_device)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)       # 梯度留着，便于统计
        n = sum(p.numel() for p in model.parameters())
        now = dev.breakdown(at_peak=False)      # 真实 GPU 上为空：分配器不知道张量的用途
        total = dev.allocated()
    return n, now, total


n_params = count_params("gpt2-small")
print(f"GPT-2 small 参数量：{n_params:,}\n")
W1 = (10, 14, 14, 20, 14)
print(row("精度", "参数 B/参数", "梯度 B/参数", "优化器状态 B/参数", "合计 B/参数", widths=W1))
for label, dtype in [("FP32", torch.float32), ("纯 BF16", torch.bfloat16)]:
    n, now, total = model_state_bytes(dtype)
    if now:
        p, g, s = (now[k] / n for k in ("parameters", "gradients", "optimizer_state"))
        print(row(label, f"{p:.2f}", f"{g:.2f}", f"{s:.2f}", f"{p + g + s:.2f}", widths=W1))
        key = "fp32" if dtype == torch.float32 else "bf16"
        for part, v in (("param", p), ("grad", g), ("state", s), ("total", p + g + s)):
            publish(f"{key}_{part}_bpp", v, fmt="{:.2f}")
    else:
        print(f"{label:<16}（GPU 上没有分类；当前已分配 {total / n:.2f} 字节/参数，含少量激活值和 cuBLAS 工作区）")

# %% [markdown]
# 与正文的公式一致：FP32 + AdamW 是 4 + 4 + 8 = 16 字节/参数，纯 BF16（权重和 AdamW 状态都是 BF16）是 2 + 2 + 4 = 8 字节/参数。小数点后的零头来自缓存分配器：每块显存至少按 512 字节取整，大块显存切分后剩下不到 1 MiB 的尾巴也算在这一块里（第 11 章细讲分配器）。纯 BF16 的张量只有 FP32 的一半大，同样的零头占比就显得大一些。
#
# ## 2. GPT-2 small 一个训练步：峰值与组成
#
# 下面的 `train_step_peak` 按 H200 参考表的方法测量（见 `vramlab/data/h200_gpt2_peaks.md`）：随机初始化的 GPT-2 small，`labels = input_ids`，每步 `loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)`。第 1 步是热身（AdamW 在第一次 `step()` 时才创建状态），然后重置峰值，再测 1 步，得到**稳态峰值**（参考表取第 2、3 步的峰值，两步一样；这里为了省时间只测第 2 步）。

# %%
def train_step_peak(batch, seq, attention="sdpa"):
    """GPT-2 small、FP32 + AdamW 的稳态峰值显存（Measurement 对象）。"""
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = build_model("gpt2-small", attention=attention, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, 50257, (batch, seq), device=dev.torch_device)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return measure_steps(step, dev, warmup=1, steps=1)


base = train_step_peak(8, 512)
print(f"稳态峰值（已分配）：{base.peak_bytes / MiB:,.0f} MiB")
print(f"第 1 步的峰值：{base.first_step_peak_bytes / MiB:,.0f} MiB（这时 AdamW 状态还不存在）")
print(f"峰值发生在：{base.peak_where or '（GPU 上不记录）'}")
publish("peak_mib", base.peak_bytes / MiB, fmt="{:.0f}")
publish("first_step_peak_mib", base.first_step_peak_bytes / MiB, fmt="{:.0f}")

# %% [markdown]
# 峰值时刻显存里有什么？模拟设备记录了每块显存是由哪个算子、在哪个阶段创建的，据此分类：`parameters`、`gradients`、`optimizer_state` 是贴了标签的张量，`activations` 是前向传播中创建、峰值时仍然活着的张量（主要是为反向传播保存的激活值），`temporaries` 是反向传播或优化器中创建的临时张量，`cuda_overhead` 是 cuBLAS 工作区。
#
# 旁边是 `vramlab.estimate` 的解析估算。它的分类略有不同：把 logits 和损失函数的张量单独列为 `logits_and_loss`（其中 log_softmax 的输出在模拟设备上算作激活值，它的两个梯度算作临时张量）。

# %% tags=["breakdown"]
est = vramlab.estimate(vramlab.Workload(model="gpt2-small", batch=8, seq=512))

W2 = (18, 20, 20)
print(row("类别", "模拟设备实测 MiB", "estimate 估算 MiB", widths=W2))
for key in ("parameters", "gradients", "optimizer_state", "activations", "logits_and_loss", "temporaries",
            "cuda_overhead", "other"):
    measured = base.breakdown.get(key)
    estimated = est.breakdown.get(key)
    m = f"{measured / MiB:,.0f}" if measured is not None else "—"
    e = f"{estimated / MiB:,.0f}" if estimated is not None else "—"
    print(row(key, m, e, widths=W2))
print(row("合计", f"{base.peak_bytes / MiB:,.0f}", f"{est.total_bytes / MiB:,.0f}", widths=W2))
print()
print("estimate 的说明：")
for key in ("gradients", "logits_and_loss", "peak"):
    print(f"- {key}: {est.notes[key]}")
for key in ("parameters", "optimizer_state", "activations", "temporaries", "cuda_overhead"):
    publish(f"sim_{key}_mib", base.breakdown.get(key, 0) / MiB, fmt="{:.0f}")
for key in ("activations", "logits_and_loss"):
    publish(f"est_{key}_mib", est.breakdown[key] / MiB, fmt="{:.0f}")
publish("est_total_mib", est.total_bytes / MiB, fmt="{:.0f}")
mib = {k: round(base.breakdown.get(k, 0) / MiB) for k in base.breakdown}     # 用四舍五入后的数相加，正文里的算式才对得上
publish("sim_static_mib", mib["parameters"] + mib["optimizer_state"] + mib["cuda_overhead"])
publish("sim_act_plus_temp_mib", mib["activations"] + mib["temporaries"])
publish("est_act_plus_logits_mib", round(est.breakdown["activations"] / MiB) + round(est.breakdown["logits_and_loss"] / MiB))

# %% [markdown]
# 两点值得注意：
#
# - **峰值时刻梯度是 0。** 峰值出现在反向传播刚开始、损失函数的梯度刚算出来的时候；上一步的梯度已被 `zero_grad(set_to_none=True)` 释放，这一步的梯度还没开始产生。所以“16 字节/参数”的模型状态并不会同时全部出现在峰值里。
# - **模型状态只是小头。** 参数加优化器状态约 1.4 GiB，激活值和损失函数附近的临时张量占了其余的大部分。
#
# ## 3. 批大小、序列长度、注意力实现
#
# 再测几组配置，并与 H200 上的实测放在一起（H200 实测，PyTorch 2.11.0+cu130，2026-11-29，`max_memory_allocated` 稳态峰值；来源：`vramlab/data/h200_gpt2_peaks.md`）。每组在模拟设备上要几秒钟。

# %%
from vramlab.reference import reference_rows

h200 = {r.name: r.steady_mib for r in reference_rows()}
configs = [  # (批大小, 序列长度, 注意力实现, H200 参考表中的行名)
    (4, 512, "sdpa", "small_fp32_adamw_b4_s512"),
    (8, 512, "sdpa", "small_fp32_adamw_b8_s512"),
    (16, 512, "sdpa", "small_fp32_adamw_b16_s512"),
    (8, 128, "sdpa", "small_fp32_adamw_b8_s128"),
    (8, 1024, "sdpa", "small_fp32_adamw_b8_s1024"),
    (8, 512, "eager", "small_fp32_adamw_b8_s512_eager"),
    (8, 1024, "eager", "small_fp32_adamw_b8_s1024_eager"),
]
results = {}
W3 = (8, 10, 8, 16, 16, 8)
print(row("批大小", "序列长度", "注意力", "本机实测 MiB", "H200 实测 MiB", "比值", widths=W3))
for b, s, attn, ref in configs:
    try:
        m = base if (b, s, attn) == (8, 512, "sdpa") else train_step_peak(b, s, attn)
    except torch.OutOfMemoryError:
        print(row(b, s, attn, "OOM", f"{h200[ref]:,}", "—", widths=W3))
        continue
    results[(b, s, attn)] = m
    mib = m.peak_bytes / MiB
    print(row(b, s, attn, f"{mib:,.0f}", f"{h200[ref]:,}", f"{mib / h200[ref]:.3f}", widths=W3))
ratios = [results[(b, s, a)].peak_bytes / MiB / h200[ref] for b, s, a, ref in configs if (b, s, a) in results]
publish("sim_h200_ratio_min", min(ratios), fmt="{:.3f}")
publish("sim_h200_ratio_max", max(ratios), fmt="{:.3f}")

# %% [markdown]
# 看相对变化更直观：

# %%
def growth(a, b):
    if a in results and b in results:
        return f"{results[b].peak_bytes / results[a].peak_bytes - 1:+.0%}"
    return "—"


for what, a, b, name in [("批大小 8 → 16（SDPA，序列 512）", (8, 512, "sdpa"), (16, 512, "sdpa"), "batch"),
                         ("序列 512 → 1024（SDPA，批大小 8）", (8, 512, "sdpa"), (8, 1024, "sdpa"), "seq_sdpa"),
                         ("序列 512 → 1024（eager，批大小 8）", (8, 512, "eager"), (8, 1024, "eager"), "seq_eager"),
                         ("SDPA → eager（序列 512）", (8, 512, "sdpa"), (8, 512, "eager"), "eager_s512"),
                         ("SDPA → eager（序列 1024）", (8, 1024, "sdpa"), (8, 1024, "eager"), "eager_s1024")]:
    print(row(what, growth(a, b), widths=(38, 8)))
    publish(f"sim_growth_{name}", growth(a, b).lstrip("+"))

# %% [markdown]
# 正文引用的 H200 参考数据（`vramlab/data/h200_gpt2_peaks.md`，同一张表）也从这里发布，连同由它们算出的相对变化，这样正文里的每个数都有同一个来处：

# %%
ref = {r.name: r for r in reference_rows()}


def h200_change(a, b, what="steady_mib"):
    return getattr(ref[b], what) / getattr(ref[a], what) - 1


BASE = "small_fp32_adamw_b8_s512"
for name in ("b4_s512", "b8_s512", "b16_s512", "b32_s512", "b8_s128", "b8_s1024", "b8_s512_eager",
             "b8_s1024_eager", "b8_s512_ckpt", "b8_s512_saveoncpu"):
    publish(f"h200_{name}_mib", ref[f"small_fp32_adamw_{name}"].steady_mib)
publish("h200_sgdm_mib", ref["small_fp32_sgdm_b8_s512"].steady_mib)
publish("h200_purebf16_mib", ref["small_purebf16_adamw_b8_s512"].steady_mib)
publish("h200_first_step_mib", ref[BASE].first_step_mib)
publish("h200_reserved_mib", ref[BASE].reserved_mib)
publish("h200_step_ms", ref[BASE].step_ms, fmt="{:.1f}")
publish("h200_saveoncpu_step_ms", ref["small_fp32_adamw_b8_s512_saveoncpu"].step_ms, fmt="{:.1f}")
publish("h200_saveoncpu_slowdown", ref["small_fp32_adamw_b8_s512_saveoncpu"].step_ms / ref[BASE].step_ms, fmt="{:.0f}")
state_mib = ref[BASE].trainable_params * 16 / MiB
publish("model_state_mib", state_mib, fmt="{:.0f}")
publish("h200_state_share", state_mib / ref[BASE].steady_mib, fmt="{:.0%}")
per_sample = (ref["small_fp32_adamw_b32_s512"].steady_mib - ref[BASE].steady_mib) / 24
publish("h200_per_sample_mib", per_sample, fmt="{:.0f}")
publish("h200_intercept_mib", ref[BASE].steady_mib - 8 * round(per_sample), fmt="{:.0f}")
for name, a, b in [("batch", BASE, "small_fp32_adamw_b16_s512"), ("seq_sdpa", BASE, "small_fp32_adamw_b8_s1024"),
                   ("seq_eager", "small_fp32_adamw_b8_s512_eager", "small_fp32_adamw_b8_s1024_eager"),
                   ("eager_s512", BASE, "small_fp32_adamw_b8_s512_eager"),
                   ("eager_s1024", "small_fp32_adamw_b8_s1024", "small_fp32_adamw_b8_s1024_eager"),
                   ("ckpt", BASE, "small_fp32_adamw_b8_s512_ckpt"), ("purebf16", BASE, "small_purebf16_adamw_b8_s512"),
                   ("saveoncpu", BASE, "small_fp32_adamw_b8_s512_saveoncpu")]:
    change = h200_change(a, b)
    print(row(f"H200：{a} → {b}", f"{change:+.0%}", widths=(80, 8)))
    publish(f"h200_change_{name}", f"{abs(change):.0%}")

# %% [markdown]
# ## 4. 画出来：峰值时刻的组成
#
# 把每组配置峰值时刻的组成画成堆叠柱状图（只有模拟设备能分类；真实 GPU 上这一步跳过）。

# %%
import matplotlib
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框

parts = [("parameters", "参数", "parameters"), ("optimizer_state", "优化器状态", "optimizer state"),
         ("gradients", "梯度", "gradients"), ("activations", "激活值", "activations"),
         ("temporaries", "临时张量", "temporaries"), ("cuda_overhead", "cuBLAS 工作区", "cuBLAS workspace")]
keys = [k for k in results if results[k].breakdown]
if keys:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"b{b} s{s}\n{attn}" for b, s, attn in keys]
    bottom = [0.0] * len(keys)
    for key, zh, en in parts:
        vals = [results[k].breakdown.get(key, 0) / 1024**3 for k in keys]
        ax.bar(labels, vals, bottom=bottom, label=zh if ZH else en)
        bottom = [x + v for x, v in zip(bottom, vals)]
    ax.set_ylabel("峰值显存 (GiB)" if ZH else "peak allocated (GiB)")
    ax.set_title("GPT-2 small，FP32 + AdamW：峰值时刻的组成" if ZH else "GPT-2 small, FP32 + AdamW: memory at the peak")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    plt.show()
else:
    print("真实 GPU 上没有分类数据：跳过这张图。")

# %% [markdown]
# 参数和优化器状态（蓝、橙）在每根柱子里都一样高：它们只取决于模型。随批大小和序列长度变化的，是激活值和损失函数附近的临时张量。eager 注意力的柱子明显更高，多出来的主要是与序列长度平方成正比的注意力分数矩阵（softmax 的输出）。
#
# ## 5. 显存与主存之间搬运
#
# 把一个 256 MiB 的张量搬到主存再搬回来，看已分配显存怎么变。`dev.to_host(t)` / `dev.to_device(t)` 在真实 GPU 上就是 `t.to("cpu")`（放进锁页内存）和 `t.to("cuda", non_blocking=True)`；在模拟设备上，主存里的张量不计入显存。

# %%
with vramlab.open_device("auto") as dev:          # 这里用真实张量（不开 FakeTensorMode）
    base_alloc = dev.allocated()
    x = torch.empty(64 * 1024 * 1024, dtype=torch.float32, device=dev.torch_device)   # 256 MiB
    print(f"在显存中创建 x 后：{(dev.allocated() - base_alloc) / MiB:.0f} MiB")
    publish("created_mib", (dev.allocated() - base_alloc) / MiB, fmt="{:.0f}")
    x_host = dev.to_host(x)
    del x
    print(f"搬到主存、删掉显存中的 x 后：{(dev.allocated() - base_alloc) / MiB:.0f} MiB")
    publish("moved_out_mib", (dev.allocated() - base_alloc) / MiB, fmt="{:.0f}")
    x = dev.to_device(x_host)
    print(f"再搬回显存后：{(dev.allocated() - base_alloc) / MiB:.0f} MiB")
    publish("moved_back_mib", (dev.allocated() - base_alloc) / MiB, fmt="{:.0f}")
    del x, x_host

# %% [markdown]
# 显存省下来了，代价是时间：每搬一次都要走 PCIe。有 GPU 时，下面这个单元格比较从**可分页内存**和**锁页内存**拷到显存的实际带宽；在模拟设备上它只打印一句说明（模拟设备不模拟传输时间）。

# %%
def h2d_bandwidth(pinned, nbytes=256 * MiB, repeats=5):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src)                                # 热身
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=pinned)
    end.record()
    torch.cuda.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1000) / 1e9   # GB/s（十进制）


if ON_GPU:
    print(f"可分页内存 → 显存：{h2d_bandwidth(False):6.1f} GB/s")
    print(f"锁页内存   → 显存：{h2d_bandwidth(True):6.1f} GB/s")
else:
    print("没有 GPU：跳过带宽测量。在有 NVIDIA GPU 的机器上运行本教程，这里会打印两种主存到显存的实测带宽。")

# %% [markdown]
# ## 小结
#
# - 模型状态按每参数字节数算：FP32 + AdamW 16 字节，纯 BF16 + AdamW 8 字节。
# - 但峰值里真正的大头是激活值和损失函数附近的临时张量；它们随批大小、序列长度增长，eager 注意力还会多出与序列长度平方成正比的分数矩阵。
# - 模拟设备的峰值与 H200 实测相差很小，`vramlab.estimate` 的解析估算也接近：先估算，再测量，两者对不上时就是该深究的地方。
