# %% [markdown]
# # 第 12 章 动手实践：谁还拉着这块显存？
#
# 这份教程配合[第 12 章 动态显存管理](ch12.md)。显存什么时候被释放，不由你调用了什么“释放函数”决定，而由**还有没有人引用这个张量**决定。我们用真实张量逐一验证六件事：
#
# 1. 评估循环里，`torch.no_grad()`、`torch.inference_mode()` 和什么都不加，峰值显存差多少？
# 2. 经典泄漏：把带计算图的 `loss` 累加起来，已分配显存如何随步数增长？
# 3. 原地操作（in-place）能省多少？版本计数器的报错长什么样？
# 4. 显存溢出（OOM）之后，异常和回溯（traceback）如何拉住显存？`del` 和 `gc.collect()` 各管什么？
# 5. `zero_grad(set_to_none=True)` 和 `False`，GPT-2 small 上差多少？
# 6. 显存复用：`del outputs`、预分配缓冲区和 `out=`。
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。模拟设备按张量存储（storage）的生死记账：存储被 Python 释放的那一刻，已分配显存就减少，和 CUDA 缓存分配器的 `memory_allocated()` 一样。除第 5 节的 GPT-2 small（FakeTensorMode，只有形状、没有数据）外，用的都是真实张量。

# %%
import contextlib
import datetime
import gc
import sys

import matplotlib
import torch
import torch.nn as nn
import transformers

import vramlab
from vramlab.meter import measure_steps
from vramlab.display import banner, pad, mib
from vramlab.models import build_model, count_params
from vramlab.reference import reference_rows
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU          # 第 1、5 节的 GPT-2 small：模拟设备上用 FakeTensorMode
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
H200 = {r.name: r for r in reference_rows()}      # H200 参考表（vramlab/data/h200_gpt2_peaks.md）


# %% [markdown]
# ## 1. 评估循环：不加、`no_grad`、`inference_mode`
#
# 评估时调用 `model.eval()` 只会切换 dropout、BN 这类层的行为，**不会**关掉自动求导。只要参数 `requires_grad=True`，前向传播就照常建计算图（computational graph），并为反向传播保存激活值。下面用 2 层的 `tiny` GPT-2 跑 3 个批次的评估（批大小 16、序列长度 128），比较三种写法的峰值。三种写法都只保存 `loss.item()`，并在每步之后 `del out`，唯一的区别是外面套的上下文。
#
# 测量前先做一次很小的前向，让 cuBLAS 工作区（32 MiB）先分配出来，“起点”一栏就包含它。

# %% tags=["eval"]
MODEL, B, T = "tiny", 16, 128
MODES = {
    "不加（model.eval() 而已）": contextlib.nullcontext,
    "torch.no_grad()": torch.no_grad,
    "torch.inference_mode()": torch.inference_mode,
}


def make_batches(n, vocab, device, b=B, t=T):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (b, t), generator=g).to(device) for _ in range(n)]


def eval_peak(ctx):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device).eval()
        batches = make_batches(3, model.config.vocab_size, dev.torch_device)
        with torch.inference_mode():
            model(input_ids=batches[0][:1])            # 热身：分配 cuBLAS 工作区
        dev.reset_peak()
        start = dev.allocated()
        total = 0.0
        with ctx():
            for ids in batches:
                out = model(input_ids=ids, labels=ids)
                total += out.loss.item()
                del out
        return start, dev.max_allocated(), dev.allocated(), total / len(batches)


evals = {name: eval_peak(ctx) for name, ctx in MODES.items()}
print(f"模型 {MODEL}（{count_params(MODEL):,} 个参数），评估 3 个批次，批大小 {B} × 序列长度 {T}\n")
print(pad("写法", 30) + pad("起点 MiB", 12) + pad("峰值 MiB", 12) + pad("峰值 - 起点", 14) + pad("结束 MiB", 12) + "平均损失")
for name, (start, peak, end, loss) in evals.items():
    print(pad(name, 30) + pad(f"{mib(start):.1f}", 12) + pad(f"{mib(peak):.1f}", 12) + pad(f"{mib(peak - start):.1f}", 14) + pad(f"{mib(end):.1f}", 12) + f"{loss:.4f}")
grad_extra = evals["不加（model.eval() 而已）"][1] - evals["不加（model.eval() 而已）"][0]
ng_extra = evals["torch.no_grad()"][1] - evals["torch.no_grad()"][0]
print(f"\n不加上下文时，评估的额外显存是 no_grad 的 {grad_extra / ng_extra:.1f} 倍")
for key, (start, peak, end, loss) in zip(["plain", "nograd", "infmode"], evals.values()):
    publish(f"eval_{key}_start_mib", start / MiB, fmt="{:.1f}")
    publish(f"eval_{key}_peak_mib", peak / MiB, fmt="{:.1f}")
    publish(f"eval_{key}_extra_mib", (peak - start) / MiB, fmt="{:.1f}")
publish("eval_extra_ratio", grad_extra / ng_extra, fmt="{:.1f}")

# %% [markdown]
# 三种写法算出的损失完全相同，峰值却差了几倍：不加上下文时，一个批次前向结束的那一刻，所有为反向保存的激活值都还在；`no_grad` 下每层的输出用完就释放，峰值只是“一两层的临时张量 + 最后的 logits”。`inference_mode` 与 `no_grad` 的峰值一样，它额外省掉的是版本计数和视图追踪这些 CPU 开销，不是显存。
#
# 再看 H200 参考表的推理一行：GPT-2 small、批大小 8、序列长度 512，`inference_mode` 下前向的已分配峰值为 1339 MiB，同一配置训练一步（FP32 + AdamW）是 7925 MiB（NVIDIA H200，PyTorch 2.11.0+cu130，来源：`vramlab/data/h200_gpt2_peaks.md`）。在本机重做推理这一行：

# %%
from vramlab.runner import measure_workload
from vramlab.workload import from_reference_name

infer = measure_workload(from_reference_name("small_fp32_infer_b8_s512"), backend="auto", fake=FAKE)
print("GPT-2 small，批大小 8，序列长度 512，inference_mode 前向")
print(pad("", 18) + pad("已分配峰值 MiB", 18) + "已保留峰值 MiB")
print(pad("本机", 18) + pad(f"{infer.peak_bytes / MiB:.0f}", 18) + f"{infer.reserved_peak_bytes / MiB:.0f}")
ref_infer = H200["small_fp32_infer_b8_s512"]
print(pad("H200 实测", 18) + pad(f"{ref_infer.steady_mib}", 18) + f"{ref_infer.reserved_mib}")
print(f"偏差（已分配）：{infer.peak_bytes / MiB / ref_infer.steady_mib - 1:+.1%}")
publish("infer_peak_mib", infer.peak_bytes / MiB, fmt="{:.0f}")
publish("infer_reserved_mib", infer.reserved_peak_bytes / MiB, fmt="{:.0f}")
publish("h200_infer_peak_mib", ref_infer.steady_mib)
publish("h200_infer_reserved_mib", ref_infer.reserved_mib)
publish("h200_base_peak_mib", H200["small_fp32_adamw_b8_s512"].steady_mib)
publish("infer_deviation", f"{infer.peak_bytes / MiB / ref_infer.steady_mib - 1:+.1%}".replace("-", "−"))

# %% [markdown]
# `inference_mode` 的代价是限制更多：在它里面创建的张量是“推理张量”（inference tensor），之后不能被自动求导保存，也不能在模式外原地修改。比如在 `inference_mode` 里缓存了一批特征，后面训练时想拿来算梯度：

# %%
with torch.inference_mode():
    feats = torch.randn(4, 8)                      # 推理张量
head = nn.Linear(8, 2)
try:
    head(feats).sum().backward()
except RuntimeError as e:
    print("RuntimeError:", e)
try:
    feats.add_(1)
except RuntimeError as e:
    print("RuntimeError:", e)
head(feats.clone()).sum().backward()               # 报错信息里给的办法：clone 出一个普通张量
print("clone() 之后可以正常求导：", head.weight.grad.shape)

# %% [markdown]
# ## 2. 经典泄漏：累加带计算图的 `loss`
#
# 下面三种评估循环都 `del out`，区别只在怎么累加损失：
#
# - `total += out.loss`，外面没有 `no_grad`：`total` 是一个带 `grad_fn` 的张量，它的计算图链接着每一步的损失，每一步的损失又链接着那一步前向保存的全部激活值。**每一步的计算图都活着**；
# - `total += out.loss.item()`：只留一个 Python 数；
# - `total += out.loss`，但外面有 `no_grad`：损失不带计算图，累加的只是一个个标量张量。
#
# 每步之后记录一次已分配显存（批大小 8，序列长度 128，10 步）。

# %%
N_STEPS = 10
LEAK = {
    "total += loss（无 no_grad）": (contextlib.nullcontext, False),
    "total += loss.item()": (contextlib.nullcontext, True),
    "no_grad 里 total += loss": (torch.no_grad, False),
}


def leak_curve(ctx, use_item):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device).eval()
        ids = make_batches(1, model.config.vocab_size, dev.torch_device, b=8)[0]
        curve, total = [], 0.0
        with ctx():
            for _ in range(N_STEPS):
                out = model(input_ids=ids, labels=ids)
                if use_item:
                    total += out.loss.item()
                else:
                    total += out.loss
                del out
                curve.append(dev.allocated())
        return curve


curves = {name: leak_curve(*args) for name, args in LEAK.items()}
print(pad("写法", 30) + pad("第 1 步后", 12) + pad("第 5 步后", 12) + pad("第 10 步后", 12) + "每步增长 MiB")
for name, c in curves.items():
    slope = (c[-1] - c[0]) / (len(c) - 1)
    print(pad(name, 30) + pad(f"{mib(c[0]):.1f}", 12) + pad(f"{mib(c[4]):.1f}", 12) + pad(f"{mib(c[-1]):.1f}", 12) + f"{slope / MiB:.2f}")
leak, flat = curves["total += loss（无 no_grad）"], curves["total += loss.item()"]
leak_slope = (leak[-1] - leak[0]) / (len(leak) - 1) / MiB
publish("leak_slope_mib", leak_slope, fmt="{:.2f}")
for i in (1, 5, 10):
    publish(f"leak_step{i}_mib", leak[i - 1] / MiB, fmt="{:.1f}")
publish("flat_mib", flat[-1] / MiB, fmt="{:.1f}")
# 按这个斜率撑满一张 24 GiB 的卡要多少步（用四舍五入后的数算，正文的算式才对得上）
publish("leak_steps_24gib", (24576 - round(flat[-1] / MiB, 1)) / round(leak_slope, 2), fmt="{:.0f}")

# %% [markdown]
# 第一种写法的已分配显存线性增长，每步增加的正好是“一次前向保存的激活值”；只要循环足够长，任何显卡都会 OOM。另外两种是平的。把曲线画出来：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")}, key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

fig, ax = plt.subplots(figsize=(7, 3.6))
styles = ["-o", "-s", "--^"]
for (name, c), style in zip(curves.items(), styles):
    ax.plot(range(1, len(c) + 1), [v / MiB for v in c], style, label=name, ms=4)
ax.set_xlabel("评估步数 (eval iteration)")
ax.set_ylabel("已分配显存 allocated (MiB)")
ax.set_title("累加带计算图的 loss：显存随步数线性增长")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# 训练循环里同样的写法（PyTorch FAQ 里的例子）又如何？训练时每步都调用了 `loss.backward()`，反向结束后计算图里保存的张量已经被释放，所以**显存**不再增长；但 `total` 的计算图节点仍然一步步连成长链，占的是主存，而且 `total` 不再是一个单纯的数。下面用 `tiny` 训练 10 步（SGD），数一数 `total.grad_fn` 能走到多少个计算图节点：

# %%
def count_nodes(fn):
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        stack.extend(nxt for nxt, _ in f.next_functions)
    return len(seen)


with vramlab.open_device("auto") as dev:
    model = build_model(MODEL, device=dev.torch_device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = make_batches(1, model.config.vocab_size, dev.torch_device, b=4, t=64)[0]
    total, allocs, nodes = 0.0, [], []
    for step in range(N_STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss                                  # FAQ 里的写法
        del loss
        allocs.append(dev.allocated())
        nodes.append(count_nodes(total.grad_fn))
print("训练循环里 total += loss：")
print(pad("", 22) + "".join(pad(f"第{i}步", 8) for i in (1, 2, 5, 10)))
print(pad("已分配显存 MiB", 22) + "".join(pad(f"{mib(allocs[i - 1]):.1f}", 8) for i in (1, 2, 5, 10)))
print(pad("计算图节点数", 22) + "".join(pad(str(nodes[i - 1]), 8) for i in (1, 2, 5, 10)))
print("total 的类型：", type(total).__name__, "requires_grad =", total.requires_grad)
publish("train_alloc_mib", allocs[-1] / MiB, fmt="{:.1f}")
publish("train_nodes_step1", nodes[0])
publish("train_nodes_step10", nodes[-1])

# %% [markdown]
# ## 3. 原地操作：省多少，什么时候报错
#
# 先量省下的显存。一个 4 层的 MLP（每层 `Linear(1024, 1024)` + `ReLU`），输入 2048 × 1024，每层输出正好 8 MiB（FP32）。比较 `nn.ReLU()` 和 `nn.ReLU(inplace=True)`：

# %%
def mlp(inplace):
    layers = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU(inplace=inplace)]
    return nn.Sequential(*layers)


def relu_run(inplace):
    torch.manual_seed(0)
    with vramlab.open_device("auto") as dev:
        net = mlp(inplace).to(dev.torch_device)
        x = torch.randn(2048, 1024, device=dev.torch_device)
        net(x).sum().backward()                        # 热身：cuBLAS 工作区
        net.zero_grad(set_to_none=True)
        dev.reset_peak()
        start = dev.allocated()
        y = net(x)
        fwd_peak, after_fwd = dev.max_allocated(), dev.allocated()
        y.sum().backward()
        return start, fwd_peak, after_fwd, dev.max_allocated()


print(pad("ReLU", 22) + pad("起点", 10) + pad("前向峰值", 12) + pad("前向结束", 12) + "整步峰值（MiB）")
relu = {}
for inplace in (False, True):
    relu[inplace] = relu_run(inplace)
    print(pad(f"inplace={inplace}", 22) + "".join(pad(f"{mib(v):.1f}", 12 if i else 10) for i, v in enumerate(relu[inplace])))
print(f"\ninplace 省下的前向峰值：{(relu[False][1] - relu[True][1]) / MiB:.1f} MiB（一层输出是 {2048 * 1024 * 4 / MiB:.0f} MiB）")
for inplace in (False, True):
    for part, v in zip(("start", "fwd_peak", "after_fwd", "step_peak"), relu[inplace]):
        publish(f"relu_{'inplace' if inplace else 'plain'}_{part}_mib", v / MiB, fmt="{:.1f}")
publish("relu_saved_mib", (relu[False][1] - relu[True][1]) / MiB, fmt="{:.1f}")

# %% [markdown]
# 只省了**一层输出**那么多，而且只在前向途中省：`Linear` 的反向只需要它的输入，不需要它的输出，所以非原地写法里 `Linear` 的输出（ReLU 之前的值）在 ReLU 算完后立刻就被释放了；原地写法省掉的只是“ReLU 的输入和输出同时存在”的那一瞬间。前向结束时保存下来的张量两边一样多，整步峰值也一样。这正是 PyTorch 文档说的“很少有原地操作能显著降低显存”。
#
# 再看风险。`sigmoid` 的反向要用它的**输出**，于是自动求导保存了输出，并记下它当时的版本号（version counter）。之后对它做原地修改，版本号加 1，反向时一对比就报错：

# %%
torch.manual_seed(0)
lin = nn.Linear(8, 8)
x = torch.randn(4, 8)
h = torch.sigmoid(lin(x))
print("原地修改前 h._version =", h._version)
h.relu_()                                          # 对 sigmoid 的输出做原地 ReLU
print("原地修改后 h._version =", h._version)
try:
    h.sum().backward()
except RuntimeError as e:
    print("RuntimeError:", e)

# %% [markdown]
# 这个报错是保护：只要没报错，梯度就是对的。绕过它的写法才真正危险。`.data` 拿到的张量不共享版本计数器，通过它原地修改，自动求导看不见，梯度**悄悄算错**；`.detach()` 共享版本计数器，同样的修改会被发现：

# %%
def sigmoid_grad(modify):
    lin.zero_grad(set_to_none=True)
    h = torch.sigmoid(lin(x))
    if modify == ".data":
        h.data.mul_(2)
    elif modify == ".detach()":
        h.detach().mul_(2)
    try:
        h.sum().backward()
    except RuntimeError as e:
        return "RuntimeError: " + str(e).split(":")[0]
    return lin.weight.grad.clone()


ref = sigmoid_grad(None)
for how in (".data", ".detach()"):
    r = sigmoid_grad(how)
    print(pad(f"通过 {how} 原地修改", 24), r if isinstance(r, str) else f"没有报错，梯度与正确值最大相差 {(r - ref).abs().max().item():.3f}")
    if how == ".data" and not isinstance(r, str):
        publish("data_grad_error", (r - ref).abs().max().item(), fmt="{:.3f}")

w = torch.randn(3, requires_grad=True)
try:
    w.add_(1)                                      # 需要梯度的叶子张量，不能在自动求导记录时原地修改
except RuntimeError as e:
    print("RuntimeError:", e)
with torch.no_grad():
    w.add_(1)                                      # 优化器就是这样原地更新参数的
print("no_grad 里原地更新叶子张量：可以，w._version =", w._version)

# %% [markdown]
# ## 4. OOM 之后：异常拉住了显存
#
# `vramlab.device_budget("128 MiB")` 打开一块只有 128 MiB 的设备（模拟设备上是一块“小显卡”；有 GPU 时用 `set_per_process_memory_fraction` 限制缓存分配器）。`tiny` 模型批大小 32、序列长度 128 的训练前向放不下，批大小 8 放得下。我们故意让它 OOM，然后观察已分配显存在几种写法下何时回落。

# %%
rows = []


def note(what, dev, extra=""):
    rows.append((what, dev.allocated(), extra))
    key = ["start", "a_caught", "a_retry", "a_left", "b_return", "b_gc", "c_saved", "c_del", "d_chunks"][len(rows) - 1]
    publish(f"oom_{key}_mib", dev.allocated() / MiB, fmt="{:.1f}")


with vramlab.device_budget("128 MiB") as dev:
    model = build_model(MODEL, device=dev.torch_device)
    ids = make_batches(1, model.config.vocab_size, dev.torch_device, b=32)[0]

    def forward(batch):
        return model(input_ids=batch, labels=batch).loss

    l = forward(ids[:8])                           # 热身：批大小 8 放得下
    del l
    note("热身之后（起点）", dev)

    # (a) 在 except 里直接重试
    try:
        loss = forward(ids)
    except torch.OutOfMemoryError as e:
        note("(a) 刚捕获 OOM，仍在 except 里", dev, ". ".join(str(e).split(". ")[:2]))
        try:
            l = forward(ids[:8])
            del l
            note("(a) except 里重试批大小 8", dev, "成功")
        except torch.OutOfMemoryError:
            note("(a) except 里重试批大小 8", dev, "又 OOM 了")
    note("(a) 离开 except 之后", dev)

    # (b) 在函数里把异常存进局部变量：帧 -> 异常 -> 回溯 -> 帧，形成引用环
    def try_forward(batch):
        try:
            return forward(batch)
        except torch.OutOfMemoryError as e:
            err = e                                # 想留着稍后打印
            return None

    try_forward(ids)
    note("(b) 函数返回之后", dev, f"gc.get_count() = {gc.get_count()}")
    found = gc.collect()
    note("(b) gc.collect() 之后", dev, f"回收了 {found} 个对象")

    # (c) 在模块顶层（notebook 单元格）把异常存进变量
    try:
        loss = forward(ids)
    except torch.OutOfMemoryError as e:
        saved = e
    note("(c) 顶层变量 saved 保存着异常", dev)
    del saved
    note("(c) del saved 之后", dev)

    # (d) PyTorch FAQ 的写法：except 里只记一个标志，恢复代码放在 except 外面
    oom = False
    try:
        loss = forward(ids)
    except torch.OutOfMemoryError:
        oom = True
    if oom:
        dev.reset_peak()
        total = 0.0
        for chunk in ids.split(8):
            l = forward(chunk)
            total += l.item() * chunk.shape[0] / ids.shape[0]
            del l
        note("(d) 改用 4 个批大小 8 的小批次", dev, f"成功，平均损失 {total:.4f}，这段的峰值 {mib(dev.max_allocated()):.1f} MiB")
        publish("oom_d_peak_mib", dev.max_allocated() / MiB, fmt="{:.1f}")

print(f"显存预算 128 MiB；gc 阈值 gc.get_threshold() = {gc.get_threshold()}\n")
print(pad("时刻", 36) + pad("已分配 MiB", 12) + "说明")
for what, alloc, extra in rows:
    print(pad(what, 36) + pad(f"{mib(alloc):.1f}", 12) + extra)

# %% [markdown]
# 读这张表：
#
# - **(a)** 在 `except` 里，异常对象的回溯还引用着出错时的每一层栈帧，栈帧里的局部变量（已经算出的激活值）都活着，所以“刚捕获”时已分配显存远高于起点，这时重试一个本来放得下的小批次也会 OOM。这正是 PyTorch FAQ 里“OOM 处理代码自己分配不到显存”的情形。离开 `except` 时 Python 自动删除 `e`，引用计数归零，显存立刻回到起点。
# - **(b)** 在函数里写了 `err = e`：函数的栈帧引用 `err`，`err` 的回溯又引用这个栈帧，形成引用环（reference cycle）。函数返回后，引用计数永远不会归零，显存一直被占着，直到循环垃圾回收器运行。`gc.collect()` 一调用，显存回到起点。自动回收迟早也会发生，但时间取决于分配了多少个 Python 对象，不可预测。
# - **(c)** 在顶层保存异常没有形成需要 `gc` 才能打破的环：`del saved` 就足以释放。
# - **(d)** 把恢复代码移到 `except` 外面，小批次顺利跑完。
#
# 在 Jupyter 里还有一个看不见的持有者：没有被捕获、打印了红色回溯的异常，会被 IPython 存进 `sys.last_value` / `sys.last_traceback`（Python 3.12 起还有 `sys.last_exc`），一直拉着那次失败前向的显存，直到下一个未捕获的异常把它替换掉。

# %% [markdown]
# ## 5. `zero_grad(set_to_none=True)` 与 `False`
#
# `set_to_none=False` 把梯度填成 0，梯度张量本身留在显存里；`True`（PyTorch 2.0 起的默认值）直接把 `.grad` 设为 `None`，梯度的显存在两步之间就被释放了。对峰值有没有影响，取决于峰值出现时梯度在不在。下面在 GPT-2 small（FP32 + AdamW，批大小 8，序列长度 512，与 H200 参考表的基线相同）上比较三种写法，第三种是把 `zero_grad()` 放在前向和反向之间：

# %%
ZG = {
    "step 后 zero_grad(set_to_none=True)": "after-none",
    "step 后 zero_grad(set_to_none=False)": "after-zero",
    "前向后、反向前 zero_grad(True)": "between",
}


def zero_grad_run(where):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = build_model("gpt2-small", device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, 50257, (8, 512), device=dev.torch_device)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            if where == "between":
                opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if where != "between":
                opt.zero_grad(set_to_none=(where == "after-none"))
            del loss
        m = measure_steps(step, dev, warmup=1, steps=2)
        return m, dev.allocated()


print("GPT-2 small，FP32 + AdamW，批大小 8，序列长度 512，稳态已分配峰值\n")
print(pad("写法", 40) + pad("峰值 MiB", 10) + pad("峰值时的梯度", 14) + "两步之间已分配 MiB")
zg = {}
for name, where in ZG.items():
    m, between = zero_grad_run(where)
    zg[where] = m
    grads = m.breakdown.get("gradients") if m.breakdown else None
    print(pad(name, 40) + pad(f"{m.peak_bytes / MiB:.0f}", 10) + pad("-" if grads is None else f"{grads / MiB:.0f}", 14) + f"{between / MiB:.0f}")
    key = where.replace("after-", "").replace("-", "_")
    publish(f"zg_{key}_peak_mib", m.peak_bytes / MiB, fmt="{:.0f}")
    publish(f"zg_{key}_grads_mib", "-" if grads is None else f"{grads / MiB:.0f}")
    publish(f"zg_{key}_between_mib", between / MiB, fmt="{:.0f}")
n_small = count_params("gpt2-small")
print(f"\nH200 实测（set_to_none=True）：{H200['small_fp32_adamw_b8_s512'].steady_mib} MiB；GPT-2 small 的 FP32 梯度 {n_small:,} × 4 字节 = {n_small * 4 / MiB:.1f} MiB")
print(f"set_to_none=False 比 True 多：{(zg['after-zero'].peak_bytes - zg['after-none'].peak_bytes) / MiB:.0f} MiB")
publish("zg_extra_mib", (zg["after-zero"].peak_bytes - zg["after-none"].peak_bytes) / MiB, fmt="{:.0f}")
publish("grad_fp32_mib", n_small * 4 / MiB, fmt="{:.1f}")
for name, where in ZG.items():
    print(pad(name, 40) + "峰值出现在 " + (zg[where].peak_where or "（真 GPU 上没有这项记录）"))

# %% [markdown]
# 三种写法的峰值都出现在反向传播的第一步：给 50257 维词表的 logits 算 `log_softmax` 的梯度，那一刻要再分配一份和 logits 一样大的张量。
#
# - `set_to_none=True` 放在 `step()` 之后：那一刻上一步的梯度已经不存在，这一步的梯度还没产生，峰值里梯度为 0。
# - `set_to_none=False`：填 0 的梯度一直占着显存，峰值多出一整份梯度（比 FP32 梯度的 474.7 MiB 略多，是缓存分配器按块取整的结果）。
# - 把 `zero_grad` 放在前向和反向之间：峰值没有变高，因为梯度恰好在峰值到来之前被清掉了；但“两步之间”一栏说明，上一步的梯度在整个前向期间都还占着显存。如果你的模型峰值出现在前向结束时（比如词表小、logits 不是大头），这份梯度就会叠加在峰值上。稳妥的位置是 `step()` 之后。
#
# ## 6. 显存复用：`del outputs`、预分配缓冲区与 `out=`
#
# 第一个技巧针对循环变量。`out = model(x)` 这一句里，右边的前向先执行，执行完才把结果赋给 `out`；所以在第二步的整个前向期间，第一步的 `out`（含 logits）还活着。在每步结束时 `del out`，就能省下一份输出。
#
# 第二个技巧针对“收集结果”。常见写法是把每批的结果 `append` 进列表，最后 `torch.cat`：拼接的那一刻，列表里的碎片和拼接结果同时存在，是两份。如果事先知道总大小，可以用 `torch.empty` 预分配一个缓冲区，每批直接写进它的切片，很多算子都接受 `out=` 参数。
#
# 下面用 `tiny` 在 `inference_mode` 下评估 6 个批次（批大小 16、序列长度 128），每批的 logits 是 $16 \times 128 \times 1024 \times 4$ 字节 = 8 MiB。

# %%
N_BATCH = 6


def reuse_run(variant):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device).eval()
        V = model.config.vocab_size
        batches = make_batches(N_BATCH, V, dev.torch_device)
        with torch.inference_mode():
            model(input_ids=batches[0][:1])            # 热身：cuBLAS 工作区
        dev.reset_peak()
        start = dev.allocated()
        with torch.inference_mode():
            if variant in ("keep", "del"):
                for ids in batches:
                    out = model(input_ids=ids)
                    _ = out.logits.mean().item()
                    if variant == "del":
                        del out
            elif variant == "cat":
                parts = []
                for ids in batches:
                    out = model(input_ids=ids)
                    parts.append(torch.softmax(out.logits, dim=-1))
                    del out
                probs = torch.cat(parts)
                del parts
            else:
                probs = torch.empty(N_BATCH * B, T, V, device=dev.torch_device)    # 预分配一次
                for i, ids in enumerate(batches):
                    out = model(input_ids=ids)
                    torch.softmax(out.logits, dim=-1, out=probs[i * B:(i + 1) * B])  # 直接写进切片
                    del out
        return start, dev.max_allocated(), dev.allocated()


REUSE = {
    "keep": "循环里不 del out",
    "del": "每步结束 del out",
    "cat": "收集概率：列表 + torch.cat",
    "out": "收集概率：预分配 + out=",
}
print(pad("写法", 30) + pad("起点 MiB", 12) + pad("峰值 MiB", 12) + pad("峰值 - 起点", 14) + "结束 MiB")
reuse = {}
for key, name in REUSE.items():
    reuse[key] = reuse_run(key)
    s, p, e = reuse[key]
    print(pad(name, 30) + pad(f"{mib(s):.1f}", 12) + pad(f"{mib(p):.1f}", 12) + pad(f"{mib(p - s):.1f}", 14) + f"{mib(e):.1f}")
print(f"\n结果张量本身：{N_BATCH} × {B} × {T} × 1024 × 4 字节 = {N_BATCH * B * T * 1024 * 4 / MiB:.0f} MiB")
extra = {k: round((p - s) / MiB, 1) for k, (s, p, e) in reuse.items()}
for k, v in extra.items():
    publish(f"reuse_{k}_extra_mib", v, fmt="{:.1f}")
publish("reuse_keep_minus_del_mib", extra["keep"] - extra["del"], fmt="{:.0f}")
publish("reuse_cat_peak_mib", reuse["cat"][1] / MiB, fmt="{:.1f}")
publish("reuse_out_peak_mib", reuse["out"][1] / MiB, fmt="{:.1f}")
publish("reuse_cat_minus_out_mib", round(reuse["cat"][1] / MiB, 1) - round(reuse["out"][1] / MiB, 1), fmt="{:.1f}")
publish("reuse_result_mib", (reuse["out"][2] - reuse["out"][0]) / MiB, fmt="{:.0f}")

# %% [markdown]
# - `del out` 让峰值少了一份 logits（8 MiB），循环结束后也不再留着最后一批的输出。
# - 列表 + `torch.cat` 的峰值里有两份结果（碎片 48 MiB + 拼接结果 48 MiB）；预分配缓冲区只有一份，再加上一个批次前向的临时张量。两者结束时都只剩一份结果。
#
# 回到正文，看这些现象背后的规则：引用计数、引用环，以及什么时候该用哪一种工具。
