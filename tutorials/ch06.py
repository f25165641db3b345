# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 第 6 章 动手教程：混合精度训练省了什么、没省什么
#
# 这份教程配合[第 6 章 混合精度训练（AMP）](ch06.md)，依次回答六个问题：
#
# 1. FP32、FP16、BF16、FP8 各能表示多大、多小、多精细的数？FP16 在哪里溢出、在哪里下溢？BF16 的“加不上去”是怎么回事？
# 2. `torch.autocast` 到底把哪些算子变成了 16 位，哪些留在 FP32？权重的类型转换缓存占多少显存？
# 3. 在一个小模型上用真实张量训练几步：BF16 autocast 的损失和 FP32 差多少，峰值显存差多少？
# 4. GPT-2 small（批大小 8、序列长度 512）上，为什么 autocast 只省了约 10%，而纯 BF16 省了约 35%？把 H200 参考表的三行在模拟设备上复现，按类别、按算子拆开看。
# 5. FP16 的损失缩放：小梯度怎样下溢，`GradScaler` 怎样动态调整缩放系数、跳过坏的一步？
# 6. 分布式训练里，梯度以什么精度通信？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。模拟设备会按 CUDA 的 autocast 规则转换类型（见 `vramlab/sim/emulation.py`），所以 `torch.autocast(dev.type, ...)` 在模拟设备上得到的是 GPU 上的类型和显存。第 4 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）几秒就能“跑”完。

# %%
import collections
import datetime
import math

import matplotlib
import torch
import torch.nn.functional as F
import transformers

import vramlab
from vramlab.meter import measure_steps
from vramlab.display import banner, pad
from vramlab.models import build_model, count_params
from vramlab.runner import build_training
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB
from vramlab.workload import from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU          # 第 4 节：模拟设备上用 FakeTensorMode
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)


def tex(x, digits=2):
    """正文公式里的写法：够大的数照常写（digits 位有效数字），很小的写成 a × 10^n。"""
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.{digits}g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa} \\times 10^{{{int(exponent)}}}"

# %% [markdown]
# ## 1. 浮点格式：位数、范围与精度
#
# 一个浮点数由符号位、指数位和尾数位组成。`torch.finfo` 给出每种格式的机器精度 `eps`（1 与下一个可表示数之差）、最大值 `max` 和最小正规数 `tiny`。尾数位数可以从 `eps` 反推：$\text{eps} = 2^{-m}$；指数位数就是总位数减去符号位和尾数位。最小的次正规数（subnormal）是 $\text{tiny} \times \text{eps}$。

# %% tags=["formats"]
FORMATS = [("FP32", torch.float32), ("FP16", torch.float16), ("BF16", torch.bfloat16),
           ("FP8 E4M3", torch.float8_e4m3fn), ("FP8 E5M2", torch.float8_e5m2)]
print(pad("格式", 10) + pad("总位数", 8) + pad("指数位", 8) + pad("尾数位", 8)
      + pad("eps", 12) + pad("最大值 max", 14) + pad("最小正规数 tiny", 18) + "最小次正规数")
for name, dt in FORMATS:
    fi = torch.finfo(dt)
    m = round(-math.log2(fi.eps))
    e = fi.bits - 1 - m
    print(pad(name, 10) + pad(fi.bits, 8) + pad(e, 8) + pad(m, 8) + pad(f"{fi.eps:.3g}", 12)
          + pad(f"{fi.max:.6g}", 14) + pad(f"{fi.tiny:.4g}", 18) + f"{fi.tiny * fi.eps:.4g}")

# %% [markdown]
# BF16 的指数位和 FP32 一样多（8 位），所以范围几乎相同，代价是尾数只有 7 位；FP16 的尾数多 3 位，但指数只有 5 位，最大只能到 65504。看几个具体的数转过去会变成什么：

# %%
vals = torch.tensor([70000.0, 65504.0, 1.0 + 2**-9, 1e-5, 1e-7, 1e-8])
print(pad("FP32 原值", 18) + pad("→ FP16", 18) + "→ BF16")
for v, h, b in zip(vals.tolist(), vals.half().float().tolist(), vals.bfloat16().float().tolist()):
    print(pad(f"{v:.8g}", 18) + pad(f"{h:.8g}", 18) + f"{b:.8g}")
publish("bf16_of_70000", f"{vals.bfloat16().float()[0].item():.0f}")
publish("bf16_of_1e8", tex(vals.bfloat16().float()[5].item(), 8))
publish("fp16_of_1e8", f"{vals.half().float()[5].item():g}")

# %% [markdown]
# 70000 在 FP16 里变成 `inf`（上溢）；`1e-8` 比 FP16 的最小次正规数 $2^{-24} \approx 5.96 \times 10^{-8}$ 还小，变成 0（下溢）；`1e-5`、`1e-7` 落在次正规数区间，只剩下几位有效数字。BF16 的问题在另一头：$1 + 2^{-9}$ 在 BF16 里就是 1，因为 1 附近相邻两个 BF16 数相差 $2^{-7} = 0.0078125$。
#
# 这个“加不上去”在纯 BF16 训练里很要命：优化器每一步给权重加一个很小的更新量，如果更新量小于权重附近间距的一半，按“舍入到最近”（round-to-nearest）规则就一点也加不上。下面把 0.001 往 1.0 上加 1000 次，对比四种做法：FP32 累加、BF16 直接累加、BF16 + Kahan 补偿求和（Kahan summation，用一个 BF16 补偿量记住每次被舍掉的部分）、BF16 + 随机舍入（stochastic rounding，按距离的比例随机向上或向下舍入）。

# %%
def stochastic_round_bf16(x32, gen):
    """把 FP32 随机舍入成 BF16：在被截掉的低 16 位上加一个均匀随机数再截断。"""
    bits = x32.view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, generator=gen, dtype=torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)   # -65536 = 0xFFFF0000


inc32 = torch.tensor(1e-3)
inc16 = inc32.to(torch.bfloat16)
w32 = torch.tensor(1.0)
w_rne = torch.tensor(1.0, dtype=torch.bfloat16)
w_kahan, comp = torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(0.0, dtype=torch.bfloat16)
w_sr, gen = torch.tensor(1.0, dtype=torch.bfloat16), torch.Generator().manual_seed(0)
for _ in range(1000):
    w32 = w32 + inc32
    w_rne = w_rne + inc16                         # BF16 舍入到最近
    y = inc16 - comp                              # Kahan：先补上次被舍掉的部分
    t = w_kahan + y
    comp = (t - w_kahan) - y                      # 这次又被舍掉了多少
    w_kahan = t
    w_sr = stochastic_round_bf16(w_sr.float() + inc32, gen)
print("1.0 加 1000 次 0.001（精确答案 2.0）")
for name, w in [("FP32", w32), ("BF16 舍入到最近", w_rne), ("BF16 + Kahan 补偿", w_kahan),
                ("BF16 + 随机舍入", w_sr)]:
    print(pad(name, 20), f"{float(w):.6f}")
    publish({"FP32": "sum_fp32", "BF16 舍入到最近": "sum_bf16", "BF16 + Kahan 补偿": "sum_kahan",
             "BF16 + 随机舍入": "sum_stochastic"}[name], float(w), fmt="{:.6f}")

# %% [markdown]
# BF16 直接累加 1000 次之后还是 1.0：每一步都被舍掉了。Kahan 补偿多存一个 BF16 补偿量（每个参数多 2 字节），得到 2.0；随机舍入不多存任何东西，结果在 2.0 附近随机波动（期望值是对的）。这就是纯 BF16 训练需要这两种技巧的原因，正文里有出处。
#
# ## 2. autocast 把哪些算子变成了 16 位
#
# 在 `torch.autocast(dev.type, dtype=torch.bfloat16)` 里，逐个调用常见算子，打印输出的类型。输入 `x` 和权重 `w` 都是 FP32。

# %%
with vramlab.open_device("auto") as dev:
    torch.manual_seed(0)
    x = torch.randn(4, 8, 64, device=dev.torch_device)
    w = torch.randn(64, 64, device=dev.torch_device, requires_grad=True)
    target = torch.zeros(32, dtype=torch.long, device=dev.torch_device)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        h = F.linear(x, w)                           # 在 16 位列表里
        rows = [
            ("F.linear(x, w)", "FP32, FP32", h),
            ("x @ x.mT (matmul)", "FP32, FP32", x @ x.mT),
            ("F.layer_norm(h)", "BF16", F.layer_norm(h, (64,))),
            ("F.softmax(h)", "BF16", F.softmax(h, dim=-1)),
            ("torch.pow(h, 3)", "BF16", torch.pow(h, 3)),
            ("torch.exp(h)", "BF16", torch.exp(h)),
            ("F.gelu(h)", "BF16", F.gelu(h)),
            ("torch.tanh(h)", "BF16", torch.tanh(h)),
            ("h + h", "BF16, BF16", h + h),
            ("h + x（残差相加）", "BF16, FP32", h + x),
            ("h.sum()", "BF16", h.sum()),
            ("F.cross_entropy", "BF16", F.cross_entropy(h.reshape(-1, 64), target)),
        ]
print(pad("算子", 24) + pad("输入类型", 14) + "输出类型")
for name, inputs, out in rows:
    print(pad(name, 24) + pad(inputs, 14) + str(out.dtype).replace("torch.", ""))

# %% [markdown]
# 规律和 PyTorch 的 autocast 算子表（CUDA 一栏）一致：
#
# - 矩阵乘法类（`linear`、`matmul`、`mm`、`bmm`、卷积……）**转成 16 位**再算，即使输入是 FP32；
# - 对范围敏感的（`layer_norm`、`softmax`、`log_softmax`、`pow`、`exp`、`sum`、各种损失……）**转成 FP32** 再算，即使输入是 BF16；
# - 其余算子（`gelu`、`tanh`、加法……）不转换，按输入类型算；BF16 加 FP32 按 PyTorch 的类型提升规则得到 FP32。
#
# ### 权重的类型转换缓存
#
# 每次 `F.linear` 都要把 FP32 权重转成 BF16。autocast 对“需要梯度的叶子张量”（也就是模型参数）的转换结果做了缓存：同一个 autocast 区域里第二次用同一个权重，不再转换。缓存直到最外层的 autocast 退出才清空；而反向传播要用 BF16 权重去算输入的梯度，所以这份 BF16 副本会一直活到反向传播用完它。用一个 1024 × 1024 的权重（FP32 4 MiB，BF16 副本 2 MiB）看看：

# %%
with vramlab.open_device("auto") as dev:
    # 先做一次很小的前向和反向：让前向、反向各自的 cuBLAS 工作区（GPU 上各 32 MiB）先建好，不混进下面的读数
    warm = torch.randn(2, 2, device=dev.torch_device, requires_grad=True)
    (warm @ warm).sum().backward()
    del warm
    w = torch.randn(1024, 1024, device=dev.torch_device, requires_grad=True)
    x = torch.randn(16, 1024, device=dev.torch_device, requires_grad=True)   # 像网络中间层的输入：需要梯度
    base = dev.allocated()
    steps = []
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        y1 = F.linear(x, w)
        steps.append(("第一次 F.linear（转换权重并缓存）", dev.allocated()))
        y2 = F.linear(x, w)
        steps.append(("第二次 F.linear（命中缓存）", dev.allocated()))
    steps.append(("退出 autocast（缓存清空，副本仍被反向传播需要）", dev.allocated()))
    (y1.float().sum() + y2.float().sum()).backward()
    w.grad = x.grad = None                           # 梯度不是这里要看的，先丢掉
    del y1, y2
    steps.append(("反向传播之后（删除输出，计算图释放）", dev.allocated()))
    prev = base
    for (label, a), key in zip(steps, ("first", "second", "exit", "end")):
        print(pad(label, 50), f"相对起点 {(a - base) / MiB:+.4f} MiB（本步 {(a - prev) / MiB:+.4f}）")
        publish(f"cache_{key}_mib", (a - base) / MiB, fmt="{:.4f}")
        publish(f"cache_{key}_step_kib", (a - prev) / 1024, fmt="{:.0f}")
        prev = a

# %% [markdown]
# 第一次调用多了 2 MiB 多一点（2 MiB 的 BF16 权重，加上 `x` 的 BF16 副本和输出，各 32 KiB）；第二次只多了 32 KiB 的输出：权重的副本是从缓存里拿的（这里的 `x` 恰好也是需要梯度的叶子张量，它的副本同样命中了缓存；网络中间层的输入不是叶子张量，每次都要重新转换）。退出 autocast 之后这 2 MiB 仍在，因为反向传播要用它；反向传播结束、计算图释放后才还回去。**对整个模型来说，这意味着 autocast 在前向到反向之间额外持有一份 BF16 权重：每个参数 2 字节。**
#
# ## 3. 真实张量：损失差多少，峰值差多少
#
# 用 2 层的 `tiny` GPT-2（词表 1024）真的训练 5 步，同样的初始权重、同样的数据，一次全 FP32，一次前向放进 BF16 autocast。按 H200 参考表的测法，峰值取第 2 步之后（AdamW 的状态在第一次 `step()` 时才创建）。

# %% tags=["tiny"]
def train_tiny(autocast, steps=5, batch=16, seq=128):
    with vramlab.open_device("auto") as dev:
        model = build_model("tiny", device=dev.torch_device, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        g = torch.Generator().manual_seed(1)
        data = [torch.randint(0, 1024, (batch, seq), generator=g).to(dev.torch_device) for _ in range(steps)]
        losses = []
        for i, ids in enumerate(data):
            if i == 1:
                dev.reset_peak()                   # 第 1 步是热身
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses, dev.max_allocated()


loss32, peak32 = train_tiny(False)
loss16, peak16 = train_tiny(True)
print(pad("步", 6) + pad("FP32 损失", 14) + pad("BF16 autocast 损失", 22) + "相对差")
for i, (a, b) in enumerate(zip(loss32, loss16), 1):
    print(pad(i, 6) + pad(f"{a:.5f}", 14) + pad(f"{b:.5f}", 22) + f"{abs(b - a) / a:.1e}")
print(f"\n稳态已分配峰值：FP32 {peak32 / MiB:.2f} MiB，BF16 autocast {peak16 / MiB:.2f} MiB，"
      f"比值 {peak16 / peak32:.2f}")
rel = [abs(b - a) / a for a, b in zip(loss32, loss16)]
publish("tiny_loss_reldiff_min", tex(min(rel), 1))
publish("tiny_loss_reldiff_max", tex(max(rel), 1))
publish("tiny_saving", 1 - peak16 / peak32, fmt="{:.0%}")

# %% [markdown]
# 损失的相对差只有 $10^{-6}$ 到 $10^{-5}$ 的量级：每个 BF16 算子只有约 3 位有效数字，但损失本身在 FP32 里计算，又是对 2048 个 token 取平均，误差大多相互抵消了。显存却只省了一成左右：这个模型只有 2 层、隐藏维度 128，cuBLAS 工作区、词表大小的 FP32 张量和模型状态占了峰值的大头，autocast 能改变的部分本来就小。下一节在 GPT-2 small 上把这笔账算清楚。
#
# ## 4. GPT-2 small：autocast 为什么只省了约 10%
#
# H200 参考表（`vramlab/data/h200_gpt2_peaks.md`，PyTorch 2.11.0+cu130，2026-11-29）里有三行：全 FP32、BF16 autocast、纯 BF16（权重和 AdamW 状态都是 BF16）。同样的三种配置在本机上再测一遍，并在模拟设备上按类别拆开峰值时刻的显存。再加两行对照：把 GPT-2 默认的 `gelu_new`（里面有 `torch.pow(x, 3.0)`）换成精确的 `gelu`，看看 `pow` 留在 FP32 的代价。

# %%
from vramlab.reference import reference_rows

H200 = {r.name: r for r in reference_rows()}      # H200 参考表（vramlab/data/h200_gpt2_peaks.md）
ROWS = [("small_fp32_adamw_b8_s512", None, "FP32", H200["small_fp32_adamw_b8_s512"].steady_mib),
        ("small_bf16autocast_adamw_b8_s512", None, "BF16 autocast", H200["small_bf16autocast_adamw_b8_s512"].steady_mib),
        ("small_purebf16_adamw_b8_s512", None, "纯 BF16", H200["small_purebf16_adamw_b8_s512"].steady_mib),
        ("small_fp32_adamw_b8_s512", "gelu", "FP32，gelu", None),
        ("small_bf16autocast_adamw_b8_s512", "gelu", "BF16 autocast，gelu", None)]


def run_row(name, act):
    """一个参考配置的稳态峰值；act 不为 None 时把每层 MLP 的激活函数换掉。"""
    w = from_reference_name(name)
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model, opt, step = build_training(w, dev)
        if act:
            for block in model.transformer.h:
                block.mlp.act = transformers.activations.ACT2FN[act]
        m = measure_steps(step, dev, warmup=1, steps=1)
        by_op = collections.Counter()
        if dev.backend == "sim":                  # 只有模拟设备记录了每块显存由哪个算子创建
            for r in dev.tracker.peak_records:
                if r.category == "activations":
                    by_op[r.op.split(".")[0]] += r.charged
        return m, by_op


results = {}
print(pad("配置", 24) + pad("本机 MiB", 12) + pad("H200 实测 MiB", 16) + pad("偏差", 10) + "相对 FP32")
for name, act, label, h200 in ROWS:
    m, by_op = run_row(name, act)
    results[label] = (m, by_op)
    ref = results["FP32，gelu" if act else "FP32"][0].peak_bytes
    dev_col = f"{m.peak_bytes / MiB / h200 - 1:+.1%}" if h200 else "-"
    print(pad(label, 24) + pad(f"{m.peak_bytes / MiB:.0f}", 12) + pad(h200 or "-", 16) + pad(dev_col, 10)
          + f"{m.peak_bytes / ref:.3f}")
    key = {"FP32": "fp32", "BF16 autocast": "autocast", "纯 BF16": "purebf16", "FP32，gelu": "fp32_gelu",
           "BF16 autocast，gelu": "autocast_gelu"}[label]
    publish(f"sim_{key}_mib", m.peak_bytes / MiB, fmt="{:.0f}")
    publish(f"sim_{key}_vs_fp32", m.peak_bytes / ref, fmt="{:.3f}")
publish("sim_max_deviation", max(abs(results[lab][0].peak_bytes / MiB / h - 1) for _, _, lab, h in ROWS if h), fmt="{:.1%}")

# %% [markdown]
# 正文引用的 H200 参考数据和由它们算出的比例也从这里发布（同一张表）：

# %%
for key, name in [("fp32", "small_fp32_adamw_b8_s512"), ("autocast", "small_bf16autocast_adamw_b8_s512"),
                  ("purebf16", "small_purebf16_adamw_b8_s512"), ("fp32_b32", "small_fp32_adamw_b32_s512"),
                  ("autocast_b32", "small_bf16autocast_adamw_b32_s512"), ("medium_ckpt", "medium_fp32_adamw_b8_s512_ckpt"),
                  ("medium_autocast_ckpt", "medium_bf16autocast_adamw_b8_s512_ckpt")]:
    publish(f"h200_{key}_mib", H200[name].steady_mib)
    publish(f"h200_{key}_ms", H200[name].step_ms, fmt="{:.1f}")
for key, a, b in [("autocast", "small_bf16autocast_adamw_b8_s512", "small_fp32_adamw_b8_s512"),
                  ("purebf16", "small_purebf16_adamw_b8_s512", "small_fp32_adamw_b8_s512"),
                  ("autocast_b32", "small_bf16autocast_adamw_b32_s512", "small_fp32_adamw_b32_s512")]:
    ratio = H200[a].steady_mib / H200[b].steady_mib
    publish(f"h200_{key}_ratio", ratio, fmt="{:.2f}")
    publish(f"h200_{key}_saving", 1 - ratio, fmt="{:.0%}")
    print(f"H200：{a} / {b} = {ratio:.3f}（省 {1 - ratio:.1%}）")
publish("h200_medium_ckpt_autocast_extra", H200["medium_bf16autocast_adamw_b8_s512_ckpt"].steady_mib
        / H200["medium_fp32_adamw_b8_s512_ckpt"].steady_mib - 1, fmt="{:.0%}")
publish("h200_autocast_speedup", H200["small_fp32_adamw_b8_s512"].step_ms / H200["small_bf16autocast_adamw_b8_s512"].step_ms, fmt="{:.1f}")

# %% [markdown]
# 前三行与 H200 实测的偏差都在 0.1% 以内。H200 上 BF16 autocast 的峰值是 FP32 的 0.90 倍，纯 BF16 是 0.65 倍。把峰值时刻的显存按类别拆开：

# %% tags=["breakdown"]
CATS = [("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"),
        ("activations", "激活值"), ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]
LABELS = ["FP32", "BF16 autocast", "纯 BF16"]
if results["FP32"][0].breakdown:
    print(pad("类别（MiB）", 16) + "".join(pad(lab, 16) for lab in LABELS))
    for key, zh in CATS:
        print(pad(zh, 16) + "".join(pad(f"{results[lab][0].breakdown[key] / MiB:.1f}", 16) for lab in LABELS))
    print(pad("合计", 16) + "".join(pad(f"{results[lab][0].peak_bytes / MiB:.1f}", 16) for lab in LABELS))
    print("\n峰值位置：", results["BF16 autocast"][0].peak_where)
    for lab, key in zip(LABELS, ("fp32", "autocast", "purebf16")):
        for cat in ("parameters", "optimizer_state", "activations", "temporaries", "cuda_overhead"):
            publish(f"{key}_{cat}_mib", results[lab][0].breakdown[cat] / MiB, fmt="{:.1f}")
    publish("autocast_activation_saving", 1 - results["BF16 autocast"][0].breakdown["activations"]
            / results["FP32"][0].breakdown["activations"], fmt="{:.0%}")
    publish("cublas_each_mib", results["FP32"][0].breakdown["cuda_overhead"] / 2 / MiB, fmt="{:.0f}")
else:
    print("真实 GPU 上没有按类别的拆分（只有模拟设备记录每块显存的来历）。")

# %% [markdown]
# 三种配置的峰值都出现在反向传播的第一步：对损失里的 `log_softmax` 求梯度。这时还没有任何参数梯度（上一步的梯度已被 `zero_grad(set_to_none=True)` 释放），所以“梯度”一行是 0。
#
# - **参数和 AdamW 状态**：autocast 一点没动。参数仍是 FP32（`124,439,808 × 4` 字节 ≈ 474.7 MiB），AdamW 的一阶矩、二阶矩也是 FP32。只有纯 BF16 把它们减半。
# - **临时张量**：两块 $8 \times 512 \times 50257$ 的 FP32 张量（`nll_loss` 和 `log_softmax` 的反向结果），每块 $4096 \times 50257 \times 4$ 字节 ≈ 785.3 MiB（4096 = 8 × 512 个位置）。损失函数在 autocast 的 FP32 列表里，transformers 计算损失前还会把 logits 显式转成 FP32（`logits.float()`），所以连纯 BF16 也逃不掉。
# - **激活值**：只有这一类变小了，而且只小了约 16%。
#
# 激活值为什么没有减半？按创建它的算子分组：

# %% tags=["by_op"]
GROUPS = [("addmm", "矩阵乘法输出 addmm"), ("_to_copy", "类型转换副本 _to_copy"), ("mul", "逐元素乘 mul"),
          ("add", "逐元素加 add"), ("tanh", "tanh"), ("gelu", "gelu"), ("native_layer_norm", "layer_norm"),
          ("_log_softmax", "log_softmax（损失）")]
cols = ["FP32", "BF16 autocast", "FP32，gelu", "BF16 autocast，gelu"]
if results["FP32"][1]:
    print(pad("激活值（MiB）", 26) + "".join(pad(c, 22) for c in cols))
    for op, zh in GROUPS:
        print(pad(zh, 26) + "".join(pad(f"{results[c][1].get(op, 0) / MiB:.1f}", 22) for c in cols))
    other = {c: sum(v for k, v in results[c][1].items() if k not in dict(GROUPS)) for c in cols}
    print(pad("其他（SDPA 输出等）", 26) + "".join(pad(f"{other[c] / MiB:.1f}", 22) for c in cols))
    print(pad("激活值合计", 26) + "".join(pad(f"{results[c][0].breakdown['activations'] / MiB:.1f}", 22) for c in cols))
    publish("autocast_to_copy_mib", results["BF16 autocast"][1].get("_to_copy", 0) / MiB, fmt="{:.1f}")
    publish("fp32_logsoftmax_mib", results["FP32"][1].get("_log_softmax", 0) / MiB, fmt="{:.1f}")
    for c, key in (("FP32，gelu", "fp32_gelu"), ("BF16 autocast，gelu", "autocast_gelu")):
        publish(f"{key}_activations_mib", results[c][0].breakdown["activations"] / MiB, fmt="{:.1f}")
    fp32 = results["FP32"][0].breakdown
    fixed = {k: round(v / MiB, 1) for k, v in (("parameters", fp32["parameters"]), ("optimizer_state", fp32["optimizer_state"]),
             ("log_softmax", results["FP32"][1].get("_log_softmax", 0)), ("temporaries", fp32["temporaries"]),
             ("cuda_overhead", fp32["cuda_overhead"]))}
    fixed_sum = sum(fixed.values())                  # 用四舍五入后的数相加，正文里的算式才对得上
    publish("fixed_sum_mib", fixed_sum, fmt="{:.1f}")
    publish("fixed_share_gelu_new", fixed_sum / (results["FP32"][0].peak_bytes / MiB), fmt="{:.0%}")
    publish("fixed_share_gelu", fixed_sum / (results["FP32，gelu"][0].peak_bytes / MiB), fmt="{:.0%}")

n = count_params("gpt2-small")
print(f"\nGPT-2 small 全部参数的 BF16 副本：{n:,} × 2 字节 = {n * 2 / MiB:.1f} MiB")
publish("bf16_copy_mib", n * 2 / MiB, fmt="{:.1f}")
publish("fp32_grad_mib", n * 4 / MiB, fmt="{:.1f}")
publish("logits_fp32_mib", 8 * 512 * 50257 * 4 / MiB, fmt="{:.1f}")
tok, hid = 8 * 512, 768
print(f"一层 MLP 中间激活（4096 个 token × 3072）：FP32 {tok * 4 * hid * 4 / MiB:.0f} MiB，BF16 {tok * 4 * hid * 2 / MiB:.0f} MiB")

# %% [markdown]
# 对照这张表可以把约 10% 这个数拆开：
#
# 1. **矩阵乘法的输出变成了 BF16**（`addmm` 一行）。换成 `gelu` 之后正好是 FP32 的一半；`gelu_new` 下更少，是因为第一个 MLP 矩阵乘法的 BF16 输出没有被保存，保存的是下面说的 FP32 副本。
# 2. **`gelu_new` 的 `pow` 留在 FP32。** GPT-2 的 `gelu_new` 是 `0.5 * x * (1 + tanh(√(2/π) * (x + 0.044715 * pow(x, 3))))`。`pow` 在 autocast 的 FP32 列表里，它把 BF16 的 `x` 转回 FP32（一份 FP32 副本，记在 `_to_copy` 里，每层 48 MiB），后面的加法、`tanh` 因为类型提升也都在 FP32 里算、存 FP32 结果。于是 autocast 下 `tanh` 和 `add` 两行与 FP32 时一样大，`mul` 只剩 `0.5 * x` 那一份 BF16。`gelu_new` 的 FP32 输出进入下一个矩阵乘法前还要再转一份 BF16。换成精确的 `gelu`（不在任何列表里的算子，BF16 进、BF16 出）之后，`gelu` 一行正好减半，FP32 的基线也小了很多：`gelu_new` 在 FP32 下本来就要存好几份中间结果。
# 3. **类型转换本身要存。** `_to_copy` 一行在 FP32 时是 0，autocast 下却是几百 MiB 到一千多 MiB：每个参数一份 BF16 副本（约 237 MiB，见上），layer_norm 的 FP32 输出转成 BF16 交给下一个矩阵乘法的副本，以及 `pow` 的 FP32 副本。
# 4. **残差流和 layer_norm 留在 FP32。** 残差相加是 BF16 + FP32，结果是 FP32（`add` 一行）；layer_norm 在 FP32 列表里，它的输入保存为 FP32。
# 5. **词表大小的 FP32 张量不变**：`log_softmax` 的输出 786 MiB，加上前面说的两块临时张量。
#
# 即使换成精确的 `gelu`，GPT-2 small 在这个配置下也只省了约 13%，因为不受 autocast 影响的部分（参数 475.5、AdamW 状态 967.5、三块词表大小的 FP32 张量 786.0 + 1572.0、cuBLAS 工作区 64.0，合计 3865.0 MiB）占了 FP32 峰值的约一半（`gelu_new`）到六成（`gelu`）。速度则是另一回事：H200 上 autocast 让一步从 87.0 ms 降到 33.0 ms，这是 BF16 Tensor Core 的功劳，与显存无关。
#
# 画成堆叠柱状图（只有模拟设备能分类；真实 GPU 上这一步跳过）：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

_cjk = [f.name for f in font_manager.fontManager.ttflist
        if any(k in f.name for k in ("Noto Sans CJK SC", "Noto Sans CJK", "Source Han Sans", "WenQuanYi",
                                     "SimHei", "Microsoft YaHei", "PingFang", "Noto Serif CJK SC"))]
if _cjk:
    matplotlib.rcParams["font.sans-serif"] = [_cjk[0]] + matplotlib.rcParams["font.sans-serif"]
    matplotlib.rcParams["axes.unicode_minus"] = False
ZH = bool(_cjk)          # 没有中文字体时只用英文标签，避免出现方框
EN = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
      "activations": "activations", "temporaries": "temporaries", "cuda_overhead": "cuBLAS workspace"}
XL = {"FP32": "FP32", "BF16 autocast": "BF16 autocast", "纯 BF16": "pure BF16"}

if results["FP32"][0].breakdown:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottom = [0.0] * len(LABELS)
    for key, zh in CATS:
        vals = [results[lab][0].breakdown[key] / MiB for lab in LABELS]
        ax.bar([lab if ZH else XL[lab] for lab in LABELS], vals, bottom=bottom, label=zh if ZH else EN[key])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.text(i, total + 80, f"{total:.0f} MiB", ha="center", fontsize=9)
    ax.set_ylabel("峰值时刻的显存 (MiB)" if ZH else "memory at the peak (MiB)")
    ax.set_title("GPT-2 small, b8 s512, AdamW：" + ("峰值时刻的组成" if ZH else "composition at the peak"))
    ax.set_ylim(0, max(bottom) * 1.12)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ## 5. FP16 与损失缩放
#
# FP16 的问题在小的一头。反向传播里的很多梯度值非常小，低于 FP16 能表示的最小次正规数 $2^{-24}$ 就变成 0。下面造一组量级在 $10^{-9}$ 到 $10^{-3}$ 之间（按对数均匀分布）的“梯度”，看看直接转 FP16 会丢掉多少，先乘 $2^{16} = 65536$ 再转 FP16、再除回来又如何：

# %%
g = torch.Generator().manual_seed(0)
grads = 10 ** (torch.rand(100_000, generator=g, dtype=torch.float64) * 6 - 9)   # 1e-9 … 1e-3
grads = grads.float()
S = 2.0 ** 16
plain = grads.half().float()
scaled = (grads * S).half().float() / S
for name, back in [("直接转 FP16", plain), (f"先乘 {S:.0f} 再转 FP16", scaled)]:
    zero = (back == 0).float().mean().item()
    rel = ((back - grads).abs() / grads).median().item()
    print(pad(name, 24), f"变成 0 的比例 {zero:6.1%}   相对误差中位数 {rel:.1e}")
    key = "plain" if back is plain else "scaled"
    publish(f"fp16_{key}_zero", zero, fmt="{:.1%}")
    publish(f"fp16_{key}_median_err", tex(rel))
print(f"乘上 {S:.0f} 之后的最大值：{(grads * S).max().item():.1f}（FP16 上限 65504，没有溢出）")

# %% [markdown]
# 缩放之后几乎所有值都保住了。但系数太大又会让大的梯度溢出成 `inf`，而合适的系数会随训练变化。`torch.amp.GradScaler` 做的是**动态损失缩放**：从 `init_scale`（默认 $2^{16}$）开始，每一步检查梯度里有没有 `inf`/`NaN`；有就跳过这一步的 `optimizer.step()`，并把系数乘以 `backoff_factor`（默认 0.5）；连续 `growth_interval`（默认 2000）步都正常，就乘以 `growth_factor`（默认 2.0）。
#
# 下面用一个小网络在 FP16 autocast 下训练 8 步。为了几步之内就能看到变化，把 `growth_interval` 设成 3；第 5 步故意把输入放大 $10^4$ 倍，让 FP16 的反向传播溢出。`GradScaler(dev.type)` 在模拟设备上就是 `GradScaler("cpu")`，在 GPU 上是 `GradScaler("cuda")`。

# %%
print("默认参数：", {k: v for k, v in vars(torch.amp.GradScaler("cpu")).items()
                     if k in ("_init_scale", "_growth_factor", "_backoff_factor", "_growth_interval")})

with vramlab.open_device("auto") as dev:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(dev.torch_device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type, growth_interval=3)
    print(pad("步", 5) + pad("本步缩放系数", 14) + pad("损失", 14) + pad("参数更新了吗", 14) + "update() 之后的系数")
    for step in range(1, 9):
        x = torch.randn(32, 256, device=dev.torch_device)
        if step == 5:
            x = x * 1e4                                   # 故意制造 FP16 溢出
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = net(x).float().pow(2).mean()
        before = net[0].weight.detach().clone()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()                     # 反向传播的是 loss × scale
        scaler.step(opt)                                  # 先除以 scale 并检查 inf/NaN，有就跳过 step
        scaler.update()                                   # 调整下一步的系数
        opt.zero_grad(set_to_none=True)
        updated = not torch.equal(before, net[0].weight.detach())
        print(pad(step, 5) + pad(f"{scale:.0f}", 14) + pad(f"{loss.detach().item():.4g}", 14)
              + pad("是" if updated else "否（跳过）", 14) + f"{scaler.get_scale():.0f}")

# %% [markdown]
# 第 3 步是连续第 3 个正常步，系数翻倍到 131072；第 5 步梯度里出现了 `inf`，`scaler.step()` 跳过了参数更新（参数没变），系数减半；之后再连续 3 步正常，系数又翻倍。真实训练里 `growth_interval` 是 2000，偶尔跳过一步是正常现象。
#
# BF16 的指数范围和 FP32 一样，上面那组小梯度转成 BF16 一个也不会变成 0，所以 BF16 autocast 一般不需要 `GradScaler`：

# %%
print("BF16 直接转换后变成 0 的比例：", f"{(grads.bfloat16() == 0).float().mean().item():.1%}")
publish("bf16_zero", (grads.bfloat16() == 0).float().mean().item(), fmt="{:.1%}")

# %% [markdown]
# ## 6. 分布式训练里，梯度以什么精度通信
#
# autocast 不改变参数的类型，所以 DDP 的梯度全规约（all-reduce）按参数的类型、也就是 FP32 进行；纯 BF16 模型则按 BF16 通信。FSDP2 的 `MixedPrecisionPolicy` 把这两件事分开配置：`param_dtype` 决定前向/反向计算和参数全收集（all-gather）用的类型，`reduce_dtype` 决定梯度规约的类型。下面只构造策略对象（不需要启动进程组），并算一算 GPT-2 small 每步要规约的梯度量：

# %%
from torch.distributed.fsdp import MixedPrecisionPolicy

policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
print(policy)
for name, nbytes in [("FP32 梯度", 4), ("BF16 梯度", 2)]:
    print(pad(name, 12), f"{n:,} × {nbytes} 字节 = {n * nbytes / MiB:.1f} MiB / 步")

# %% [markdown]
# 小结：autocast 省的是激活值里能变成 16 位的那部分，而且要扣掉类型转换副本；模型状态、损失相关的 FP32 张量原封不动，所以在 GPT-2 small 的这个配置下只省了约 10%。要再省，就得像纯 BF16 那样动模型状态（配合 Kahan 补偿或随机舍入），或者把激活值交给第 7 章的激活检查点。
