# %% [markdown]
# # 第 2 章 动手教程：看清显存读数，抓住峰值
#
# 这份教程配合[第 2 章 显存监控工具](ch02.md)。我们做五件事：
#
# 1. 跑一个 GPT-2 small 的训练步，把**已分配**和**已保留**显存随时间的变化画出来；
# 2. 在峰值时刻拆开看：显存被哪几类东西占着，最大的几块是谁分配的；
# 3. 认识 `memory_stats()` 的几个键，它们与 `torch.cuda.memory_stats()` 同名；
# 4. 手写一个 `measure_peak(fn, device)`，并看清“调用结束后再读 `allocated()`”为什么会漏掉峰值；
# 5. 在 CPU 上试一试 PyTorch Profiler 的内存视图，以及（有 GPU 时）NVML 和显存快照。
#
# 没有 GPU 时，代码在 CPU 上的**模拟设备**里运行。第 1、2 节打开 FakeTensorMode：张量只有形状和类型、没有数据，GPT-2 small 一步几秒就能“跑”完，统计到的是 CUDA 缓存分配器会报告的数字。有 NVIDIA GPU 时，`vramlab.open_device("auto")` 会改用真卡。

# %%
import datetime

import torch
import transformers

import vramlab
from vramlab.models import build_model
from vramlab.display import banner, pad, mib
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU          # 模拟设备上用 FakeTensorMode：只有形状，没有数据
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 一个训练步里，显存怎么涨、怎么落
#
# 配置与 H200 参考表的基线一致（`vramlab/data/h200_gpt2_peaks.md`）：随机初始化的 GPT-2 small，FP32 + AdamW，批大小 8，序列长度 512，每步 `loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)`。我们跑 3 步，第 1 步之后重置峰值，这样第 2、3 步测到的是**稳态峰值**（AdamW 的状态在第一次 `step()` 时才创建）。
#
# 每一步结束时，我们记下三个数：这一步里的峰值 `max_allocated()`、步末的 `allocated()` 和 `reserved()`。

# %%
with vramlab.open_device("auto", fake=FAKE) as dev:
    model = build_model("gpt2-small", device=dev.torch_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, 50257, (8, 512), device=dev.torch_device)
    after_build = dev.allocated()
    step_rows, step_marks = [], [len(dev.snapshot()["timeline"])]
    for step in range(1, 4):
        dev.reset_peak()                     # 每一步单独看峰值
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        dev.synchronize()
        step_rows.append((step, dev.max_allocated(), dev.allocated(), dev.reserved()))
        step_marks.append(len(dev.snapshot()["timeline"]))
    snap = dev.snapshot()                    # 峰值、峰值时刻的组成、时间线（模拟设备才有）
    top = dev.top_allocations(6) if hasattr(dev, "top_allocations") else []
    stats = dev.memory_stats()

print(f"建好模型后已分配：{mib(after_build):.1f} MiB（模型参数）\n")
print(f"{pad('步', 4)}{pad('本步峰值 max_allocated', 26)}{pad('步末 allocated', 18)}{pad('步末 reserved', 18)}")
for step, peak, alloc, res in step_rows:
    print(f"{step:<4}{mib(peak):>10.1f} MiB{'':12}{mib(alloc):>10.1f} MiB{'':4}{mib(res):>10.1f} MiB")
    publish(f"step{step}_peak_mib", mib(peak), fmt="{:.1f}")
    publish(f"step{step}_alloc_mib", mib(alloc), fmt="{:.1f}")
    publish(f"step{step}_reserved_mib", mib(res), fmt="{:.1f}")
publish("params_mib", mib(after_build), fmt="{:.1f}")
publish("step_end_alloc_gib", step_rows[-1][2] / 2**30, fmt="{:.1f}")
publish("first_step_gap_mib", mib(step_rows[1][1] - step_rows[0][1]), fmt="{:.0f}")

# %% [markdown]
# 读这张表要注意三点：
#
# - **步末的 `allocated()` 远低于本步峰值。** 步末只剩参数和 AdamW 状态；激活值和反向传播的临时张量在这一步中间来过、又走了。只在步与步之间读显存的监控，永远看不到那座山峰。
# - **第 1 步的峰值比第 2、3 步低。** AdamW 的一阶矩、二阶矩在第一次 `step()` 里才创建，所以从第 2 步起，峰值里多了它们。测量训练显存时要先热身一步。
# - **`reserved()` 比 `allocated()` 高，而且不回落。** 这是缓存分配器把释放的块留在手里备用；nvidia-smi 看到的是它（再加上 CUDA 上下文）。
#
# 下面把整条时间线画出来。横轴是分配/释放事件的序号（不是时间），竖虚线是步与步的分界。

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = next((f.name for f in font_manager.fontManager.ttflist
            if f.name in ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "SimHei")), None)
if CJK:
    plt.rcParams["font.sans-serif"] = [CJK, "DejaVu Sans"]
    plt.rcParams["axes.unicode_minus"] = False


def label(zh, en):
    """有中文字体时用中文标注，否则用英文，避免图里出现方框。"""
    return zh if CJK else en


timeline = snap["timeline"]
if timeline:
    alloc = [mib(e["allocated"]) for e in timeline]
    res = [mib(e["reserved"]) for e in timeline]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.plot(res, color="tab:orange", lw=1.5, label=label("已保留 reserved", "reserved"))
    ax.plot(alloc, color="tab:blue", lw=1.2, label=label("已分配 allocated", "allocated"))
    for m in step_marks:
        ax.axvline(m, color="gray", ls="--", lw=0.8)
    for (step, peak, a, r), x in zip(step_rows, step_marks[1:]):
        ax.plot([x], [mib(a)], "o", color="tab:red")
    ax.plot([], [], "o", color="tab:red", label=label("步末读数 allocated()", "allocated() after each step"))
    ax.axhline(mib(snap["peak_bytes"]), color="tab:blue", ls=":", lw=1,
               label=label(f"稳态峰值 {mib(snap['peak_bytes']):.0f} MiB", f"steady peak {mib(snap['peak_bytes']):.0f} MiB"))
    ax.set_xlabel(label("分配 / 释放事件序号", "allocation / free event index"))
    ax.set_ylabel("MiB")
    ax.set_title(label("GPT-2 small 训练 3 步（模拟设备，FP32 + AdamW，b8 s512）",
                       "GPT-2 small, 3 training steps (simulated device, fp32 + AdamW, b8 s512)"))
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    plt.show()
    print(f"时间线共 {len(timeline)} 个事件；每步的事件区间：{step_marks}")
else:
    print("真实 GPU 上没有这条时间线：请用本教程第 5 节的 torch.cuda.memory._record_memory_history() 录制快照，"
          "再拖进 https://pytorch.org/memory_viz 查看。")

# %% [markdown]
# 三座山峰：前向传播时激活值越攒越多，反向传播刚开始时到顶，随后激活值逐个释放、梯度逐个出现，最后优化器更新、清空梯度。第 1 座山峰矮一截，原因同上；第 1 步末尾那段抬升，正是 AdamW 第一次创建一阶矩和二阶矩。
#
# 橙色的已保留曲线只升不降：释放的块留在缓存分配器里。红点是步末读数：它们都落在“山谷”里。
#
# ## 2. 峰值时刻：显存里都是什么
#
# `snapshot()["breakdown"]` 是峰值那一刻还活着的张量按类别的合计，`top_allocations()` 列出那一刻最大的几块以及创建它们的算子和位置。真实 GPU 上缓存分配器不知道张量的用途，所以这两项只有模拟设备给得出来；GPU 上对应的工具是第 5 节的显存快照。

# %%
NAMES = {"parameters": "模型参数", "gradients": "梯度", "optimizer_state": "优化器状态",
         "activations": "激活值", "temporaries": "临时张量（反向/优化器）",
         "cuda_overhead": "cuBLAS 工作区", "other": "其他"}
print(f"稳态峰值 {mib(snap['peak_bytes']):.1f} MiB，发生在：{snap['peak_where'] or '（GPU 上不记录）'}\n")
if snap["breakdown"]:
    for k, v in snap["breakdown"].items():
        print(f"{pad(NAMES[k], 26)}{mib(v):>10.1f} MiB  {v / snap['peak_bytes']:>6.1%}")
        publish(f"peak_{k}_mib", mib(v), fmt="{:.1f}")
        publish(f"peak_{k}_share", v / snap["peak_bytes"], fmt="{:.1%}")
    print()
for r in top:
    print(f"{mib(r['bytes']):>8.1f} MiB  {r['category']:<16}{r['op']:<38}{r['where']}")
if top:
    publish("top_block_mib", mib(top[0]["bytes"]), fmt="{:.1f}")
    publish("logits_exact_mib", 8 * 512 * 50257 * 4 / MiB, fmt="{:.1f}")
    publish("top_block_tail_mib", mib(top[0]["bytes"]) - 8 * 512 * 50257 * 4 / MiB, fmt="{:.1f}")
    publish("top3_share", sum(r["bytes"] for r in top[:3]) / snap["peak_bytes"], fmt="{:.0%}")

# %% [markdown]
# 峰值出现在反向传播的第一个算子（`LogSoftmaxBackward0`）里。此刻梯度还是 0：它们要等反向传播往回走才会逐个出现，而到那时，大部分激活值已经释放了。最大的三块都是 $8 \times 512 \times 50257$ 个 FP32 数的词表大小张量：`log_softmax` 的输出，以及反向传播里 `nll_loss` 和 `log_softmax` 各自算出的梯度。每块的数据是 $8 \times 512 \times 50257 \times 4$ 字节 ≈ 785.3 MiB（算术），记作 786 MiB，是因为请求本身只取整到 512 字节，但这个请求第一次出现时缓存里没有合适的空闲块，分配器新申请了一段（10 MiB 以上的新段按 2 MiB 取整，即 786 MiB），段尾剩下的不到 1 MiB 不再切分，整段记在这个张量名下（见第 11 章）。这正是“先找出峰值里最大的那一块”的价值：对这个配置，词表维度上的 logits 是一个很值得优化的目标。
#
# ## 3. `memory_stats()`：与 `torch.cuda.memory_stats()` 同名的键
#
# 模拟设备和 `vramlab.CudaDevice` 的 `memory_stats()` 都返回 `torch.cuda.memory_stats()` 的一个子集，键名相同，所以同一段监控代码两边都能用。

# %%
MEANING = {
    "allocated_bytes.all.current": "当前已分配，即 torch.cuda.memory_allocated()",
    "allocated_bytes.all.peak": "已分配峰值，即 torch.cuda.max_memory_allocated()",
    "reserved_bytes.all.current": "当前已保留，即 torch.cuda.memory_reserved()",
    "reserved_bytes.all.peak": "已保留峰值，即 torch.cuda.max_memory_reserved()",
    "inactive_split_bytes.all.current": "已切分但空闲的块（碎片的一种度量，第 11 章）",
    "num_alloc_retries": "因显存不够而清缓存重试的次数",
}
for k, v in stats.items():
    shown = f"{mib(v):.1f} MiB" if k.endswith("bytes.all.current") or k.endswith("bytes.all.peak") else str(v)
    print(f"{k:<34}{shown:>12}   {MEANING[k]}")
publish("cached_free_mib", mib(stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]), fmt="{:.0f}")

# %% [markdown]
# 把第 1 节的读数与 H200 参考表的基线行 `small_fp32_adamw_b8_s512` 对照（H200 实测，PyTorch 2.11.0+cu130，2026-11-29，来源：`vramlab/data/h200_gpt2_peaks.md`）：

# %%
from vramlab.reference import reference_rows

_base = {r.name: r for r in reference_rows()}["small_fp32_adamw_b8_s512"]      # H200 参考表的基线一行
H200 = {"第 1 步峰值 max_allocated": _base.first_step_mib, "稳态峰值 max_allocated": _base.steady_mib,
        "已保留峰值 max_reserved": _base.reserved_mib}
ours = {"第 1 步峰值 max_allocated": mib(step_rows[0][1]),
        "稳态峰值 max_allocated": mib(max(r[1] for r in step_rows[1:])),
        "已保留峰值 max_reserved": mib(stats["reserved_bytes.all.peak"])}
print(f"{pad('读数', 30)}{'H200 实测':>10}{'本次运行':>10}{'差异':>8}")
for k, ref in H200.items():
    print(f"{pad(k, 30)}{ref:>8} MiB{ours[k]:>8.0f} MiB{ours[k] / ref - 1:>+10.2%}")
for key, k in (("first", "第 1 步峰值 max_allocated"), ("steady", "稳态峰值 max_allocated"), ("reserved", "已保留峰值 max_reserved")):
    publish(f"h200_{key}_mib", H200[k])
    publish(f"sim_{key}_mib", ours[k], fmt="{:.0f}")
publish("sim_h200_max_deviation", max(abs(ours[k] / H200[k] - 1) for k in H200), fmt="{:.2%}")
publish("h200_warmup_gap_mib", _base.steady_mib - _base.first_step_mib)
publish("h200_warmup_gap_share", (_base.steady_mib - _base.first_step_mib) / _base.steady_mib, fmt="{:.1%}")
for key, name in (("base", "small_fp32_adamw_b8_s512"), ("b32_ckpt", "small_fp32_adamw_b32_s512_ckpt"),
                  ("medium_ckpt", "medium_fp32_adamw_b8_s512_ckpt")):
    r = {x.name: x for x in reference_rows()}[name]
    publish(f"h200_{key}_alloc_mib", r.steady_mib)
    publish(f"h200_{key}_reserved_mib", r.reserved_mib)
    publish(f"h200_{key}_gap_mib", r.reserved_mib - r.steady_mib)
    publish(f"h200_{key}_gap_share", r.reserved_mib / r.steady_mib - 1, fmt="{:.1%}")

# %% [markdown]
# `num_alloc_retries` 值得放进训练日志：它大于 0，说明分配器已经在“清缓存再试”的边缘挣扎，离 OOM 不远了，也往往意味着训练在变慢。
#
# ## 4. 手写 `measure_peak(fn, device)`
#
# 监控最常见的错误，是在函数返回之后才读 `allocated()`。下面这个函数先保留一个 64 MiB 的结果，中途又用了一个 256 MiB 的临时张量，返回前把临时张量释放了：

# %%
def spiky(device):
    """返回一个 64 MiB 的张量；中途用了 256 MiB 的临时张量，返回前已释放。"""
    keep = torch.zeros(16 * 2**20, device=device)            # 16M 个 FP32 = 64 MiB
    tmp = torch.ones(64 * 2**20, device=device)              # 64M 个 FP32 = 256 MiB
    keep[:1] = tmp.sum()
    del tmp
    return keep


def measure_after(fn, device):
    """错误示范：调用结束后才读当前已分配显存。"""
    fn_result = fn()
    device.synchronize()
    return device.allocated(), fn_result


def measure_peak(fn, device):
    """fn() 运行期间的峰值显存（字节，含调用前已经占用的部分）。"""
    device.synchronize()
    device.reset_peak()            # 把峰值计数器重置为“当前已分配”
    fn()
    device.synchronize()           # GPU 上等所有内核跑完
    return device.max_allocated()


with vramlab.open_device("auto") as dev:
    resident = torch.zeros(32 * 2**20, device=dev.torch_device)   # 调用前就占着的 128 MiB
    base = dev.allocated()
    after, kept = measure_after(lambda: spiky(dev.torch_device), dev)
    del kept
    peak = measure_peak(lambda: spiky(dev.torch_device), dev)
    after_all = dev.allocated()

print(f"调用前已分配          {mib(base):8.1f} MiB")
print(f"错误做法：返回后读    {mib(after):8.1f} MiB   （只比调用前多 {mib(after - base):.1f} MiB）")
print(f"measure_peak 的峰值   {mib(peak):8.1f} MiB   （比调用前多 {mib(peak - base):.1f} MiB）")
print(f"返回值释放后已分配    {mib(after_all):8.1f} MiB")
publish("spiky_base_mib", mib(base), fmt="{:.1f}")
publish("spiky_after_mib", mib(after), fmt="{:.1f}")
publish("spiky_after_delta_mib", mib(after - base), fmt="{:.1f}")
publish("spiky_peak_mib", mib(peak), fmt="{:.1f}")
publish("spiky_peak_delta_mib", mib(peak - base), fmt="{:.1f}")

# %% [markdown]
# 错误做法报告的增量只有 64 MiB，真正的峰值增量是 320 MiB（64 + 256）。`reset_peak()` 把峰值计数器拉回到当前值，`max_allocated()` 读的是此后出现过的最高点，中间的尖峰一个也漏不掉，因为它是在**每一次分配时**更新的，而不是定时采样。
#
# 在真实 GPU 上，这两个方法就是 `torch.cuda.reset_peak_memory_stats()` 和 `torch.cuda.max_memory_allocated()`，`vramlab.CudaDevice` 只是转调它们。本章的评分练习 `ch02-monitor` 要你写的正是这个函数。
#
# `vramlab.measure` 把同一件事包装好了：在一个**全新**的设备上运行函数，返回峰值和峰值时刻的组成。因为设备是新的，函数里要自己创建张量：

# %%
m = vramlab.measure(lambda: spiky("cuda" if ON_GPU else "cpu"), backend="auto")
print(m)
print(f"已分配峰值 {mib(m.peak_bytes):.1f} MiB，已保留峰值 {mib(m.reserved_peak_bytes):.1f} MiB，"
      f"结束时 reserved - allocated = {mib(m.fragmentation_bytes):.1f} MiB")
publish("measure_peak_mib", mib(m.peak_bytes), fmt="{:.1f}")
publish("measure_reserved_mib", mib(m.reserved_peak_bytes), fmt="{:.1f}")
publish("measure_reserved_extra_mib", mib(m.reserved_peak_bytes - m.peak_bytes), fmt="{:.0f}")

# %% [markdown]
# 已保留峰值比已分配峰值多出的 2 MiB，来自 `tmp.sum()` 那个只有 4 字节的结果：不超过 1 MiB 的请求也要先向驱动要一整个 2 MiB 的“小段”，再从里面切 512 字节。缓存分配器的分段和取整规则见第 11 章。函数返回、结果也释放之后，已分配回到 0，已保留却还是 322 MiB：这就是 nvidia-smi 读数“降不下来”的原因。
#
# ## 5. PyTorch Profiler 的内存视图（CPU 上演示）
#
# Profiler 按算子统计内存：`Self CPU Mem` 是算子自己分配的内存（减去释放的），`CPU Mem` 还包括它调用的子算子。在 GPU 上把 `ProfilerActivity.CUDA` 加进 `activities`，表里就多出 `Self CUDA Mem` 一列，按 `sort_by="self_cuda_memory_usage"` 排序。这里用一个 2 层的小 GPT-2 在普通 CPU 张量上演示（不在模拟设备里）。

# %%
from torch.profiler import ProfilerActivity, profile

tiny = build_model("tiny")
tiny_ids = torch.randint(0, 1024, (4, 128))
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
    tiny(input_ids=tiny_ids, labels=tiny_ids).loss.backward()

avg = prof.key_averages()
print(avg.table(sort_by="self_cpu_memory_usage", row_limit=8, max_name_column_width=36))

# %% [markdown]
# 表里的时间列在不同机器上各不相同，只看内存列即可。注意 Profiler 写的“MB”其实是按 1024 × 1024 字节算的，也就是 MiB。`Self CPU Mem` 出现负数，表示这个算子释放的比分配的多。Profiler 统计的是每个算子分配减释放的**净量**，并把同名算子的所有调用加在一起，它不是峰值：想知道峰值，还得靠 `max_memory_allocated()` 或显存快照。
#
# ## 6. 有 GPU 时：NVML 与显存快照
#
# 下面两个单元只在有 NVIDIA GPU 的机器上做事。第一个用 NVML（`pip install nvidia-ml-py`，导入名是 `pynvml`）读驱动的账：整卡已用多少、本进程被记了多少，并与 PyTorch 的 `memory_reserved()` 比较，差值主要是 CUDA 上下文。第二个录制显存快照，生成的 `.pickle` 可以拖进 <https://pytorch.org/memory_viz> 查看。

# %%
import os

if not ON_GPU:
    print("本机没有 NVIDIA GPU：跳过 NVML。")
else:
    try:
        import pynvml
    except ImportError:
        pynvml = None
        print("没有安装 nvidia-ml-py：pip install nvidia-ml-py")
    if pynvml is not None:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        info = pynvml.nvmlDeviceGetMemoryInfo(h)
        print(f"整卡：total {mib(info.total):.0f} MiB，used {mib(info.used):.0f} MiB，free {mib(info.free):.0f} MiB")
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            mine = "（本进程）" if p.pid == os.getpid() else ""
            used = "N/A" if p.usedGpuMemory is None else f"{mib(p.usedGpuMemory):.0f} MiB"
            print(f"进程 {p.pid}：{used}{mine}")
        print(f"PyTorch：allocated {mib(torch.cuda.memory_allocated()):.0f} MiB，"
              f"reserved {mib(torch.cuda.memory_reserved()):.0f} MiB")
        del x
        pynvml.nvmlShutdown()

# %%
if not ON_GPU:
    print("本机没有 NVIDIA GPU：跳过显存快照。")
else:
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    spiky("cuda")
    torch.cuda.memory._dump_snapshot("/tmp/ch02_snapshot.pickle")
    torch.cuda.memory._record_memory_history(enabled=None)      # 停止录制
    print("快照已写入 /tmp/ch02_snapshot.pickle：拖进 https://pytorch.org/memory_viz 查看")
    print(torch.cuda.memory_summary(abbreviated=True))

# %% [markdown]
# ## 小结
#
# - 峰值发生在训练步的**中间**（这里是反向传播的第一个算子），步与步之间读 `allocated()` 看不到它；用 `reset_peak()` + `max_allocated()`（GPU 上是 `reset_peak_memory_stats()` + `max_memory_allocated()`）。
# - `reserved` ≥ `allocated`：缓存分配器留着释放的块；nvidia-smi 的读数还要再加上 CUDA 上下文。
# - 想知道峰值里是谁，模拟设备给出分类和最大的几块；GPU 上用显存快照和 memory_viz。
