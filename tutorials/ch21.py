# %% [markdown]
# # 第 21 章 动手实践：埋一个泄漏，把它找出来，再让训练自己从 OOM 里爬起来
#
# 这份教程配合[第 21 章 显存溢出（OOM）排查](ch21.md)。我们在一张“虚拟显卡”上做五件事：
#
# 1. 读懂 OOM 报错：“真的不够”和“碎片”两种情况，报错里的数字有什么不同？
# 2. 埋下一个泄漏：每步把 logits 存进列表“留着调试”，看已分配显存一步步往上爬，直到 `torch.OutOfMemoryError`；
# 3. 诊断：`dev.top_allocations()`、逐层的前向/反向钩子、显存时间线，分别怎样指向同一个凶手；修好之后损失一模一样，显存不再涨；
# 4. 梯度爆炸检测：用 `clip_grad_norm_` 的返回值监控梯度范数，发现尖峰和 `NaN`/`inf`；`torch.autograd.detect_anomaly` 怎样找出第一个产生 `NaN` 的反向算子；FP16 `GradScaler` 的溢出跳步什么时候正常、什么时候该报警；
# 5. 自动 OOM 恢复：为什么不能在 `except` 里重试；一个“微批次减半 → 打开激活检查点”的恢复循环，结果与不受限的训练一致。
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。`vramlab.device_budget("160 MiB")` 把设备变成一张只有 160 MiB 的虚拟显卡：放不下时抛出和 CUDA 一样的 `torch.OutOfMemoryError`，报错文字也照 CUDA 的格式写（在 GPU 上，它用 `torch.cuda.set_per_process_memory_fraction` 给缓存分配器设上限）。全部用真实张量，模型是 2 层的 `tiny` GPT-2（隐藏维度 128，词表 1024）。

# %%
import datetime
import gc
import math
import re
import time
import traceback
import warnings
import weakref

import torch
import transformers

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
warnings.filterwarnings("ignore", message="Full backward hook is firing")   # 嵌入层的输入是整数，没有梯度
ON_GPU = banner()
MiB = 2 ** 20
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
MODEL, VOCAB = "tiny", 1024


def make_ids(b, s, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, s), generator=g).to(device)


def oom_fields(msg):
    """从 OOM 报错里取出四个数：这次要申请的、总容量、PyTorch 已分配的、已保留但未分配的。"""
    pat = {"要申请": r"Tried to allocate ([\d.]+ \w+)", "总容量": r"total capacity of ([\d.]+ \w+)",
           "已分配": r"([\d.]+ \w+) is allocated by PyTorch",
           "已保留未分配": r"([\d.]+ \w+) is reserved by PyTorch but unallocated"}
    out = {}
    for key, p in pat.items():
        m = re.search(p, msg)
        out[key] = m.group(1) if m else "?"
    return out

# %% [markdown]
# ## 1. 读懂 OOM 报错
#
# CUDA 缓存分配器在抛出 OOM 之前，已经把能还给驱动的整段空闲缓存都还了、再试过一次。所以报错里的“reserved by PyTorch but unallocated”（已保留但未分配）是**还不掉**的那部分：被切开、和活着的张量同住一个段的空闲块。它和“要申请多少”一比，就知道是真的不够，还是碎了。
#
# 在一张 64 MiB 的虚拟显卡上造两种情况：
#
# - **真的不够**：9 个 6 MiB 的张量都活着，再要 12 MiB；
# - **碎片**：同样先放 9 个 6 MiB 的张量，然后隔一个释放一个（已分配降到 24 MiB），再要 12 MiB。1–10 MiB 的请求由分配器从 20 MiB 的段里切出来，每个段里还住着活张量，整段还不回去，而 12 MiB 又大于任何一个空洞。

# %%
def oom_case(free_every_other):
    with vramlab.device_budget("64 MiB") as dev:
        blocks = [torch.empty(6 * MiB // 4, device=dev.torch_device) for _ in range(9)]
        if free_every_other:
            for i in range(0, 9, 2):
                blocks[i] = None
        msg = None
        try:
            torch.empty(12 * MiB // 4, device=dev.torch_device)
        except torch.OutOfMemoryError as e:
            msg = str(e)
        stats = dev.memory_stats()
        del blocks
        return msg, stats


cases = {"真的不够": oom_case(False), "碎片": oom_case(True)}
print("“碎片”一例的完整报错：\n")
print(cases["碎片"][0].replace(". ", ".\n"))
print()
print(pad("情况", 12) + pad("要申请", 12) + pad("总容量", 12) + pad("已分配", 12) + pad("已保留但未分配", 18)
      + "inactive_split MiB")
for name, (msg, stats) in cases.items():
    f = oom_fields(msg)
    print(pad(name, 12) + pad(f["要申请"], 12) + pad(f["总容量"], 12) + pad(f["已分配"], 12)
          + pad(f["已保留未分配"], 18) + f"{mib(stats['inactive_split_bytes.all.current']):.1f}")

publish("frag_card_mib", 64)
publish("frag_block_mib", 6)
publish("frag_request_mib", 12)
for key, name in (("full", "真的不够"), ("frag", "碎片")):
    f = oom_fields(cases[name][0])
    publish(f"{key}_allocated_mib", float(f["已分配"].split()[0]), fmt="{:.0f}")
    publish(f"{key}_unallocated_mib", float(f["已保留未分配"].split()[0]), fmt="{:.0f}")
    publish(f"{key}_inactive_split_mib", mib(cases[name][1]["inactive_split_bytes.all.current"]), fmt="{:.0f}")

# %% [markdown]
# 两行的“要申请”都是 12 MiB。第一行已分配 54 MiB、已保留但未分配只有 6 MiB：活着的张量把卡占满了，要么减少张量（减批、检查点、混合精度……），要么换大卡。第二行已分配只有 24 MiB，已保留但未分配却有 36 MiB，比要申请的 12 MiB 还多：显存其实够，只是被切碎了。这正是真卡报错末尾那句建议的场景：“If reserved but unallocated memory is large try setting `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`”（模拟设备的报错省略了这句，改为附上一句中文说明）。`memory_stats()` 里的 `inactive_split_bytes` 与它相互印证。
#
# ## 2. 埋下一个泄漏
#
# 下面是一个“能跑”的训练步。它唯一的问题是把每一步的 logits 存进模型上的一个列表，想着“出了问题再看”。logits 的形状是 $[B, S, V]$，FP32 下每步多留 $B \times S \times V \times 4$ 字节；批大小 8、序列长度 128、词表 1024 时是 4 MiB（算术）。
#
# 在一张 160 MiB 的虚拟显卡上跑 12 步，每步之后记下已分配和已保留显存。OOM 时只在 `except` 里记一个标志，离开 `except` 之后再处理（第 5 节解释为什么）。在 GPU 上，同时用 `torch.cuda.memory._record_memory_history()` 录下显存快照，可以拖进 <https://pytorch.org/memory_viz> 查看。

# %%
B, S, STEPS, CARD = 8, 128, 12, "160 MiB"
publish("leak_card_mib", CARD.split()[0])
publish("logits_mib", B * S * VOCAB * 4 / MiB, fmt="{:.0f}")
print(f"每步 logits：{B} × {S} × {VOCAB} × 4 字节 = {B * S * VOCAB * 4 / MiB:.2f} MiB（算术）")


def leaky_step(model, opt, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.debug_logits.append(out.logits)          # “留着调试”：这就是泄漏
    return out.loss.item()


def fixed_step(model, opt, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.debug_stats.append(out.logits.detach().abs().max().item())   # 只留一个 Python 数
    return out.loss.item()


def run(step_fn, card=CARD, steps=STEPS, snapshot_file="ch21_leak_snapshot.pickle"):
    """在虚拟显卡上训练 steps 步；返回每步的记录、OOM 信息，以及留给诊断用的设备对象。"""
    rows, oom_at, oom_msg, marks = [], None, None, []
    with vramlab.device_budget(card) as dev:
        if ON_GPU:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        model = build_model(MODEL, device=dev.torch_device)
        model.debug_logits, model.debug_stats = [], []
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = make_ids(B, S, dev.torch_device)
        for step in range(1, steps + 1):
            failed, msg = False, None
            try:
                loss = step_fn(model, opt, ids)
            except torch.OutOfMemoryError as e:
                failed, msg = True, str(e)        # except 里只做记录
            if failed:
                oom_at, oom_msg = step, msg
                break
            rows.append((step, loss, dev.allocated(), dev.reserved(), dev.max_allocated()))
            marks.append(len(dev.snapshot()["timeline"]))
        opt.zero_grad(set_to_none=True)
        result = dict(rows=rows, oom_at=oom_at, oom_msg=oom_msg, marks=marks,
                      top=dev.top_allocations(8, at_peak=False) if hasattr(dev, "top_allocations") else [],
                      timeline=dev.snapshot()["timeline"], kept=len(model.debug_logits))
        if ON_GPU:
            torch.cuda.memory._dump_snapshot(snapshot_file)
            torch.cuda.memory._record_memory_history(enabled=None)
        del model, opt, ids
        gc.collect()
    return result


# %% tags=["leak"]
leak = run(leaky_step)
print(pad("步", 6) + pad("损失", 10) + pad("步后已分配 MiB", 18) + pad("比上一步多", 14) + pad("已保留 MiB", 14) + "已分配峰值 MiB")
prev = None
for step, loss, alloc, res, peak in leak["rows"]:
    delta = "" if prev is None else f"{mib(alloc - prev):+.2f}"
    print(pad(str(step), 6) + pad(f"{loss:.4f}", 10) + pad(f"{mib(alloc):.2f}", 18) + pad(delta, 14)
          + pad(f"{mib(res):.1f}", 14) + f"{mib(peak):.1f}")
    prev = alloc
print(f"\n第 {leak['oom_at']} 步 OOM：")
print(leak["oom_msg"].replace(". ", ".\n"))

after = [mib(r[2]) for r in leak["rows"]]
deltas = [b - a for a, b in zip(after, after[1:])]
publish("leak_oom_step", leak["oom_at"])
publish("leak_last_step", leak["rows"][-1][0])
publish("leak_step1_after_mib", after[0], fmt="{:.2f}")
publish("leak_last_after_mib", after[-1], fmt="{:.2f}")
lo, hi = f"{min(deltas):.2f}", f"{max(deltas):.2f}"
publish("leak_delta_mib", lo if lo == hi else f"{lo}–{hi}")      # 每步都一样时只写一个数
peaks = [round(mib(r[4]), 1) for r in leak["rows"]]
publish("leak_step2_peak_mib", peaks[1], fmt="{:.1f}")
peak_step = round(peaks[2] - peaks[1])                   # 第 2 步之后峰值每步抬高多少（取整的 MiB）
publish("leak_peak_step_mib", peak_step)
publish("leak_predicted_peak_mib", peaks[1] + peak_step * (leak["oom_at"] - 2), fmt="{:.1f}")
reserved = [round(mib(r[3])) for r in leak["rows"]]
jump = next(i for i in range(2, len(reserved)) if reserved[i] > reserved[i - 1])
publish("leak_reserved_jump_step", leak["rows"][jump][0])
publish("leak_reserved_before_mib", reserved[jump - 1])
publish("leak_reserved_after_mib", reserved[jump])
f = oom_fields(leak["oom_msg"])
publish("leak_oom_allocated_mib", f["已分配"].split()[0])
publish("leak_oom_unallocated_mib", f["已保留未分配"].split()[0])
publish("leak_oom_request_mib", f["要申请"].split()[0])

# %% [markdown]
# 已分配显存每步整整多 4.00 MiB，正好是一份 logits；峰值也跟着每步抬高 4 MiB，直到某一步的前向或反向再也申请不到。注意 OOM 发生在哪里：报错说的是“这次要申请的”那一小块（发生在哪个模块由模拟设备附注），它只是压垮骆驼的最后一根稻草，和病根（`debug_logits.append`）毫无关系。**OOM 的位置不等于泄漏的位置**，所以要看“谁占着显存”，而不是“谁申请失败”。
#
# ## 3. 诊断：三种工具指向同一个凶手
#
# ### 3.1 `dev.top_allocations()`：现在最大的几块是谁分配的
#
# 模拟设备为每一块显存记下分配它的算子、当时所在的模块和类别。OOM 之后（已经离开 `except`），列出还活着的最大的几块：

# %%
if leak["top"]:
    print(pad("字节数", 12) + pad("MiB", 8) + pad("算子", 22) + pad("分配时所在的模块", 32) + "类别")
    for r in leak["top"]:
        print(pad(f"{r['bytes']:,}", 12) + pad(f"{mib(r['bytes']):.2f}", 8) + pad(r["op"], 22) + pad(r["where"], 32)
              + r["category"])
    n_lm = sum(1 for r in leak["top"] if r["where"] == "lm_head")
    print(f"\n前 {len(leak['top'])} 块里有 {n_lm} 块来自 lm_head；列表里留着 {leak['kept']} 份 logits。")
    publish("top_n", len(leak["top"]))
    publish("top_n_lm_head", n_lm)
    publish("top_workspace_mib", max(mib(r["bytes"]) for r in leak["top"] if r["category"] == "cuda_overhead"), fmt="{:.0f}")
    publish("top_lm_head_mib", max(mib(r["bytes"]) for r in leak["top"] if r["where"] == "lm_head"), fmt="{:.0f}")
else:
    print("在 GPU 上：把 ch21_leak_snapshot.pickle 拖进 https://pytorch.org/memory_viz，"
          "在 Active Memory Timeline 里把鼠标停在一直不释放的那些块上，看分配它们的调用栈。")

# %% [markdown]
# 除了两块 32 MiB 的 cuBLAS 工作区（前向线程、反向线程各一块，模拟设备把它们记为 `cuda_overhead`，真卡上同样存在），其余最大的几块全是 `lm_head` 里 `mm` 的输出，每块 4 MiB，类别是激活值（activations），而此刻根本没有前向在进行。这就是泄漏：本该在这一步结束时释放的激活值，被谁留住了。真卡上的显存快照给出的是同样的信息，外加每一块的 Python 调用栈。
#
# ### 3.2 逐层钩子：谁在前向里分配了多少，谁的输出活过了这一步
#
# 不依赖任何工具也能做到：给关心的模块注册前向钩子（`register_forward_pre_hook` / `register_forward_hook`）和反向钩子（`register_full_backward_hook`），在里面读 `allocated()`。前向钩子还用弱引用（`weakref.ref`）记住模块的输出张量：一步结束、所有局部变量都删掉之后，弱引用还能取到对象，就说明有人还握着这个输出。
#
# 先热身一步（让两块 cuBLAS 工作区先分配好，不算进第一层），再在第 2 步挂上钩子。

# %%
WATCH = ["transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1", "transformer.ln_f", "lm_head"]


class LayerTracer:
    """逐层记录：前向前后的已分配显存、输出大小、反向经过该层时的已分配显存，以及输出是否活过这一步。"""

    def __init__(self, model, dev, names):
        self.dev, self.names, self.rec, self.refs, self.handles = dev, names, {}, {}, []
        for name, mod in model.named_modules():
            if name in names:
                self.handles += [mod.register_forward_pre_hook(self._pre(name)),
                                 mod.register_forward_hook(self._post(name)),
                                 mod.register_full_backward_hook(self._bwd(name))]

    def _pre(self, name):
        def hook(mod, args):
            self.rec[name] = {"before": self.dev.allocated()}
        return hook

    def _post(self, name):
        def hook(mod, args, out):
            t = out if isinstance(out, torch.Tensor) else out[0]
            self.rec[name].update(after=self.dev.allocated(), out=t.untyped_storage().nbytes())
            self.refs[name] = weakref.ref(t)
        return hook

    def _bwd(self, name):
        def hook(mod, grad_in, grad_out):
            self.rec[name]["bwd"] = self.dev.allocated()
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()

    def table(self):
        print(pad("模块", 20) + pad("前向前 MiB", 12) + pad("前向净增", 10) + pad("输出 MiB", 10)
              + pad("反向经过时 MiB", 16) + "步后输出还活着？")
        for n in self.names:
            r = self.rec[n]
            alive = self.refs[n]() is not None
            print(pad(n, 20) + pad(f"{mib(r['before']):.2f}", 12) + pad(f"{mib(r['after'] - r['before']):+.2f}", 10)
                  + pad(f"{mib(r['out']):.2f}", 10) + pad(f"{mib(r.get('bwd', 0)):.2f}", 16) + ("是  ←" if alive else "否"))


def trace_one_step(step_fn, key):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        model.debug_logits, model.debug_stats = [], []
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = make_ids(B, S, dev.torch_device)
        step_fn(model, opt, ids)                       # 热身
        start = dev.allocated()
        tracer = LayerTracer(model, dev, WATCH)
        step_fn(model, opt, ids)
        tracer.remove()
        print(f"这一步开始时已分配 {mib(start):.2f} MiB，结束时 {mib(dev.allocated()):.2f} MiB\n")
        tracer.table()
        for name in ("transformer.h.0", "transformer.h.1", "lm_head"):
            r = tracer.rec[name]
            publish(f"{key}_{name.split('.')[-1].replace('_', '')}_net_mib", mib(r["after"] - r["before"]), fmt="{:.2f}")
        publish(f"{key}_alive", "、".join(n for n in WATCH if tracer.refs[n]() is not None) or "无")
        publish(f"{key}_watched", len(WATCH))
        del model, opt, ids


print("【有泄漏的训练步】")
trace_one_step(leaky_step, "trace_leak")

# %% [markdown]
# 读这张表：
#
# - “前向净增”是这一层前向留下的显存：它自己的输出加上为反向保存的张量。两个 Transformer 块各留十几 MiB，`lm_head` 留 4 MiB（logits）。这一列回答“激活值主要在哪一层”，是做激活检查点、调整批大小时的依据；
# - “反向经过时”随反向推进而下降：反向从 `lm_head` 走到 `wte`，每过一层就释放那一层保存的张量；
# - 最后一列是诊断泄漏的关键：一步结束后，只有 `lm_head` 的输出还活着，也就是有人还握着 logits。
#
# ### 3.3 显存时间线
#
# 模拟设备记录了每一次分配和释放之后的已分配显存（`dev.snapshot()["timeline"]`，真卡上对应显存快照里的 Active Memory Timeline）。把泄漏那次运行画出来，竖线是每一步的结束：

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
if leak["timeline"]:
    tl = leak["timeline"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.plot([mib(p["allocated"]) for p in tl], lw=0.8, label="已分配" if ZH else "allocated")
    ax.plot([mib(p["reserved"]) for p in tl], lw=0.8, label="已保留" if ZH else "reserved")
    ax.axhline(160, color="red", ls="--", lw=1, label="虚拟显卡 160 MiB" if ZH else "virtual card 160 MiB")
    for m in leak["marks"]:
        ax.axvline(m, color="gray", lw=0.4)
    ax.set_xlabel("分配/释放事件序号" if ZH else "allocation event")
    ax.set_ylabel("MiB")
    ax.set_title("每步把 logits 存进列表：锯齿的谷底一步比一步高" if ZH
                 else "Logits kept every step: each valley is higher than the last")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    plt.show()
else:
    print("在 GPU 上没有逐次分配的时间线；用 memory_viz 打开 ch21_leak_snapshot.pickle。")

# %% [markdown]
# 正常的训练在时间线上是一排高度相同的锯齿：每步前向涨上去，反向和 `step()` 之后落回同一个谷底。泄漏的时间线上，**谷底**一步比一步高，斜率就是每步泄漏的字节数。看到这种形状，就去找“每步都往某个容器里放东西”的代码。
#
# ### 3.4 修好它
#
# 真要留调试信息，就只留 Python 数（`.item()`）或搬到主存（`.detach().cpu()`）。`fixed_step` 只存每步 logits 的最大绝对值。同一张 160 MiB 的卡、同样的 12 步：

# %%
fixed = run(fixed_step, snapshot_file="ch21_fixed_snapshot.pickle")
print(pad("步", 6) + pad("修复前损失", 14) + pad("修复后损失", 14) + pad("修复前已分配 MiB", 20) + "修复后已分配 MiB")
for i, (step, loss, alloc, _, _) in enumerate(fixed["rows"]):
    before = leak["rows"][i] if i < len(leak["rows"]) else None
    print(pad(str(step), 6) + pad(f"{before[1]:.4f}" if before else "（已 OOM）", 14) + pad(f"{loss:.4f}", 14)
          + pad(f"{mib(before[2]):.2f}" if before else "—", 20) + f"{mib(alloc):.2f}")
same = all(a[1] == b[1] for a, b in zip(leak["rows"], fixed["rows"]))
print(f"\n修复后跑完 {len(fixed['rows'])} 步，OOM：{fixed['oom_at'] or '无'}；"
      f"两次都跑过的 {len(leak['rows'])} 步损失逐位相同：{same}")
print(f"修复后的已分配峰值 {mib(max(r[4] for r in fixed['rows'])):.1f} MiB")
fixed_after = sorted({f"{mib(r[2]):.2f}" for r in fixed["rows"]}, key=float)
publish("fixed_steps", len(fixed["rows"]))
publish("fixed_after_mib", fixed_after[0] if len(fixed_after) == 1 else f"{fixed_after[0]}–{fixed_after[-1]}")
publish("fixed_peak_mib", mib(max(r[4] for r in fixed["rows"])), fmt="{:.1f}")
publish("fixed_same_losses", "逐位相同" if same else "不完全相同")
print("\n【修复后的训练步】")
trace_one_step(fixed_step, "trace_fixed")

# %% [markdown]
# 损失逐位相同：泄漏从来不影响计算，只影响显存。修好之后，每步结束时的已分配显存从第 1 步起就一直是同一个数，所有层的输出都已释放。本章的评分练习 `ch21-leak` 就是这个场景的完整版。
#
# ## 4. 梯度爆炸检测
#
# 梯度爆炸本身不直接占显存，但它和显存问题常常一起出现：损失变成 `NaN` 之后，有人会以为“是不是显存坏了”；FP16 训练里，溢出的梯度会让 `GradScaler` 跳步；而为了排查爆炸打开的 `detect_anomaly` 又会让每一步变慢。先看监控。
#
# ### 4.1 用 `clip_grad_norm_` 的返回值监控
#
# `torch.nn.utils.clip_grad_norm_` 返回的是**裁剪之前**的总范数（把所有梯度看成一个长向量的 2-范数），所以裁剪和监控可以一次完成，不用再算一遍。检测器做三件事：
#
# 1. 总范数不是有限数（`NaN`/`inf`）：这一步不更新，记下来；
# 2. 总范数超过最近的指数滑动平均的 10 倍：标为尖峰，不更新；
# 3. 出事时列出范数最大的几个参数，告诉你先看哪一层。
#
# 我们在 `tiny` 模型上训练 12 步，埋两颗雷：第 6 步的损失被一个错误的权重放大了 $10^4$ 倍（模拟数据或损失权重的 bug）；第 9 步的损失里加了一项“特征长度”正则 $\sqrt{\sum h^2}$，而特征先乘了补齐掩码，补齐位置是全零行：前向完全正常，反向却在 $\sqrt{0}$ 处得到 `inf`，再乘上 0 变成 `NaN`。

# %%
class GradHealth:
    def __init__(self, max_norm=1.0, spike=10.0, warmup=3, beta=0.9):
        self.max_norm, self.spike, self.warmup, self.beta = max_norm, spike, warmup, beta
        self.ema, self.seen = None, 0

    def check(self, model):
        """在 backward 之后、optimizer.step() 之前调用。返回 (裁剪前的范数, 状态, 范数最大的参数)。"""
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm).item()
        worst = sorted(((p.grad.norm().item(), n) for n, p in model.named_parameters() if p.grad is not None),
                       key=lambda x: -x[0] if math.isfinite(x[0]) else -math.inf)
        if not math.isfinite(norm):
            bad = [n for v, n in worst if not math.isfinite(v)]
            return norm, "非有限，跳过", [f"{len(bad)}/{len(worst)} 个参数的梯度含 NaN/inf"]
        if self.seen >= self.warmup and norm > self.spike * self.ema:
            return norm, f"尖峰（>{self.spike:.0f}×均值 {self.ema:.2f}），跳过", [n for _, n in worst[:2]]
        self.ema = norm if self.ema is None else self.beta * self.ema + (1 - self.beta) * norm
        self.seen += 1
        return norm, "正常", []


def feature_norm_penalty(h):
    return torch.sqrt((h ** 2).sum(-1)).mean()          # 特征向量长度的均值；h 有全零行时反向出 NaN


def health_step(model, ids, step):
    out = model(input_ids=ids, labels=ids, output_hidden_states=True)
    loss = out.loss
    if step == 6:
        loss = loss * 1e4                               # 雷 1：错误的损失权重
    if step == 9:
        mask = torch.ones(ids.shape[0], ids.shape[1], 1, device=ids.device)
        mask[:, :4] = 0                                 # 雷 2：补齐位置的掩码是 0，特征被乘成全零行
        loss = loss + 0.01 * feature_norm_penalty(out.hidden_states[-1] * mask)
    loss.backward()
    return loss.item()


with vramlab.open_device("auto") as dev:
    model = build_model(MODEL, device=dev.torch_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = GradHealth()
    print(pad("步", 5) + pad("损失", 12) + pad("裁剪前梯度范数", 16) + pad("判断", 30) + "先看这些参数")
    for step in range(1, 13):
        ids = make_ids(4, 64, dev.torch_device, seed=step)
        loss = health_step(model, ids, step)
        norm, status, suspects = monitor.check(model)
        if status == "正常":
            opt.step()
        opt.zero_grad(set_to_none=True)
        print(pad(str(step), 5) + pad(f"{loss:.4g}", 12) + pad(f"{norm:.4g}", 16) + pad(status, 30) + ", ".join(suspects))
        if step == 6:
            publish("spike_loss_e4", loss / 1e4, fmt="{:.3f}")
            publish("spike_norm", norm, fmt="{:.0f}")
            publish("spike_ema", re.search(r"均值 ([\d.]+)", status).group(1) if "尖峰" in status else "（未判为尖峰）")
        if step == 9:
            publish("nan_step_loss", loss, fmt="{:.3f}")
            publish("nan_step_norm", f"{norm}")
    del model, opt

# %% [markdown]
# 两颗雷都被拦住了，而且表现不同：第 6 步的损失本身就很大，范数是平时的上千倍；第 9 步的损失完全正常，梯度里却满是 `NaN`（`NaN` 一旦进入反向，就沿着计算图传给上游的所有参数，所以“先看哪些参数”在这里帮不上忙，要靠下一节的工具），只看损失曲线根本发现不了。两次都跳过了 `optimizer.step()`，所以坏梯度没有进入参数和 AdamW 的状态，之后的训练照常。
#
# 还要知道一个细节：`clip_grad_norm_` 在总范数是 `inf` 时，裁剪系数 `max_norm / (inf + 1e-6)` 是 0，每个梯度被原地乘以 0：有限的元素变成 0，本身是 `inf` 的元素变成 `NaN`（$\infty \times 0$）；是 `NaN` 时则全部变成 `NaN`。它默认不报错（`error_if_nonfinite=False`），所以“裁剪了就安全”是错的，**必须检查返回值**。
#
# ### 4.2 `detect_anomaly`：第一个产生 `NaN` 的反向算子是谁
#
# 知道“第 9 步出了 `NaN`”之后，下一个问题是“哪个算子”。`torch.autograd.detect_anomaly()` 让前向记录每个算子的调用栈，并在反向里检查每个算子的输出：一出现 `NaN` 就抛出 `RuntimeError`，并打印产生它的那个前向调用的位置。把出事的那一步在它里面重放一遍：

# %%
with vramlab.open_device("auto") as dev:
    model = build_model(MODEL, device=dev.torch_device)
    ids = make_ids(4, 64, dev.torch_device, seed=9)
    caught = []
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly():
                health_step(model, ids, step=9)
        except RuntimeError as e:
            caught.append(str(e))
    print("RuntimeError:", caught[0] if caught else "（没有报错）")
    for w in ws:
        lines = str(w.message).splitlines()
        hits = [i for i, ln in enumerate(lines) if "in feature_norm_penalty" in ln]
        if hits:
            print("\n同时发出的警告里，产生它的前向调用（节选）：")
            print("\n".join(lines[hits[0]:hits[0] + 2]))
            break
    del model

# %% [markdown]
# 它指向 `PowBackward0`，前向位置是 `feature_norm_penalty` 里的 `h ** 2`。为什么不是 `sqrt`？$\sqrt{s}$ 在 $s = 0$ 处的导数是 $\frac{1}{2\sqrt{s}} = \infty$，`SqrtBackward0` 输出的是 `inf`，不是 `NaN`；再往回一步，$\partial(h^2)/\partial h = 2h = 0$，$0 \times \infty$ 才得到 `NaN`。所以 `detect_anomaly` 报告的是“第一个输出 `NaN` 的反向算子”，病根可能在它紧挨着的上游。修法是给开方加一个小的 $\epsilon$（`torch.sqrt(x + 1e-12)`），或者改用对零向量做了处理的 `torch.linalg.vector_norm`。
#
# 它的代价：PyTorch 文档警告这个模式“只应在调试时打开”，因为各种检查会拖慢程序。下面在同一台机器上各跑 3 个正常的训练步比较一下（CPU 计时，每次运行都会不同，只看量级）：

# %%
def time_steps(anomaly, n=3):
    with vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = make_ids(4, 64, dev.torch_device)
        health_step(model, ids, step=1)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        for _ in range(n):
            with torch.autograd.set_detect_anomaly(anomaly):
                health_step(model, ids, step=1)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) / n


t_off, t_on = time_steps(False), time_steps(True)
print(f"每步耗时：关闭 {t_off * 1e3:.0f} ms，打开 detect_anomaly {t_on * 1e3:.0f} ms，约 {t_on / t_off:.1f} 倍")

# %% [markdown]
# 在这个小模型上慢多少倍取决于 CPU 负载和算子数；在 GPU 上，检查每个反向输出是否含 `NaN` 还要把结果同步回 CPU，代价通常更高。所以它只用来**复现**已经定位到某一步的问题，不要挂在整个训练上。日常监控用 4.1 的范数检测器就够了。
#
# ### 4.3 FP16 的 `GradScaler`：跳步什么时候正常
#
# FP16 训练里，`GradScaler` 每步检查梯度有没有 `inf`/`NaN`：有就跳过 `optimizer.step()`，缩放系数减半（[第 6 章](ch06.md)）。训练开始时系数偏大，头几步溢出跳步是正常的校准；但如果**连续**很多步都在跳，系数一路减半下去，那就不是缩放的问题，而是模型真的发散了（或者输入里有 `inf`）。判断“这一步跳了没有”不需要访问内部状态：`update()` 之后系数变小了，就是跳了。
#
# 下面用一个小网络在 FP16 autocast 下训练 14 步：`init_scale` 故意设成 $2^{21}$，让开头几步溢出；第 8 步起输入里混进了一个接近 FP16 上限的值（模拟坏数据），每一步都溢出。监控器在连续跳步达到 4 次时报警。

# %%
class ScalerWatch:
    """update() 之后系数变小 = 这一步溢出、被跳过。连续跳过 max_consecutive 步就报警。"""

    def __init__(self, max_consecutive=4):
        self.max_consecutive, self.run, self.skipped = max_consecutive, 0, 0

    def after_update(self, scale_before, scale_after):
        skipped = scale_after < scale_before
        self.run = self.run + 1 if skipped else 0
        self.skipped += skipped
        if self.run >= self.max_consecutive:
            return f"报警：连续 {self.run} 步溢出"
        return f"跳过（连续第 {self.run} 次）" if skipped else "正常"


with vramlab.open_device("auto") as dev:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev.torch_device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 21)
    watch = ScalerWatch()
    scales, verdicts = [], []
    print(pad("步", 5) + pad("本步系数", 14) + pad("损失", 12) + pad("update() 后", 14) + "判断")
    for step in range(1, 15):
        x = torch.randn(32, 64, device=dev.torch_device)
        if step >= 8:
            x[0, 0] = 6e4                                   # 坏数据：接近 FP16 的上限 65504
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = net(x).float().pow(2).mean()
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        verdict = watch.after_update(before, scaler.get_scale())
        scales.append((before, scaler.get_scale()))
        verdicts.append(verdict)
        print(pad(str(step), 5) + pad(f"{before:.0f}", 14) + pad(f"{loss.item():.4g}", 12)
              + pad(f"{scaler.get_scale():.0f}", 14) + verdict)
    print(f"\n共跳过 {watch.skipped} 步")
calib = next(i for i, (b, a) in enumerate(scales) if a == b)      # 第一个没有跳过的步（从 0 数）
publish("scaler_calib_skips", calib)
publish("scaler_calib_scale", f"{scales[calib][0]:.0f}")
publish("scaler_calib_log2", f"{math.log2(scales[calib][0]):.0f}")
publish("scaler_alarm_step", next(i for i, v in enumerate(verdicts, 1) if v.startswith("报警")))
publish("scaler_final_scale", f"{scales[-1][1]:.0f}")
publish("scaler_skipped", watch.skipped)

# %% [markdown]
# 开头 3 步，系数从 $2^{21}$ 减半到 $2^{18}$（262144），梯度乘上系数不再溢出，之后一直正常：这是校准。第 8 步起每一步都溢出，第 11 步是连续第 4 次，监控器报警；到第 14 步，系数已经掉到 2048。此时正确的做法是停下来查数据和模型（比如用 4.2 的 `detect_anomaly` 重放这一步），而不是让 `GradScaler` 继续把系数减到几乎为 0、训练“安静地”什么都不更新。
#
# ## 5. 自动 OOM 恢复
#
# ### 5.1 为什么不能在 `except` 里重试
#
# 异常对象带着回溯（traceback），回溯引用着从捕获处到出错处的每一层栈帧，栈帧又引用着各自的局部变量：在一次失败的前向里，它们正是已经算出来的激活值。只要还在 `except` 块里，这些张量就释放不掉。Python 在 `except ... as e:` 块结束时会自动删除 `e`；但如果你把它存到了别处（比如 `err = e`，为了稍后打印），这些栈帧就一直活着。在一张 128 MiB 的虚拟显卡上让批大小 32 的前向 OOM，看已分配显存：

# %%
def oom_then(keep_exception):
    """批大小 32 的训练前向在 128 MiB 的虚拟显卡上 OOM；记录几个时刻的已分配显存。"""
    log = []
    with vramlab.device_budget("128 MiB") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        ids = make_ids(32, 128, dev.torch_device)
        log.append(("起点（参数、输入）", dev.allocated()))
        saved = None
        try:
            model(input_ids=ids, labels=ids).loss.backward()
        except torch.OutOfMemoryError as e:
            log.append(("还在 except 块里", dev.allocated()))
            if keep_exception:
                saved = e                                # 反面教材：为了“稍后打印”把异常对象留了下来
        log.append(("离开 except 块之后", dev.allocated()))
        if keep_exception:
            msg = str(saved)                             # 要保留的只是文字
            saved = None
            log.append(("只留 str(e)，saved = None 之后", dev.allocated()))
        del model, ids
    return log


for keep, title in ((False, "写法 A：except 里只做记录"), (True, "写法 B：saved = e")):
    print(title)
    log = oom_then(keep)
    for what, alloc in log:
        print("    " + pad(what, 34) + f"{mib(alloc):8.2f} MiB")
    key = "except_b" if keep else "except_a"
    vals = [round(mib(a), 2) for _, a in log]
    publish(f"{key}_start_mib", vals[0], fmt="{:.2f}")
    publish(f"{key}_inside_mib", vals[1], fmt="{:.2f}")
    publish(f"{key}_after_mib", vals[2], fmt="{:.2f}")
    if not keep:
        publish("except_workspace_mib", vals[2] - vals[0], fmt="{:.2f}")    # 起点之外一直留着的：cuBLAS 工作区
        publish("except_held_mib", vals[1] - vals[2], fmt="{:.2f}")         # 回溯拉住的激活值

# %% [markdown]
# 在 `except` 块里，失败的前向已经算出的七十多 MiB 激活值都还在（起点之外多出的 32 MiB 是前向线程的 cuBLAS 工作区，它会一直留着）。写法 A 一离开 `except`，Python 删除 `e`，回溯和栈帧随之释放；写法 B 把异常存了下来，离开 `except` 之后显存仍被拉着，直到这个名字不再引用它。所以恢复代码要写在 `except` 外面；要保留错误信息就存 `str(e)`；确实要保存异常对象时，用完立刻删掉，必要时 `gc.collect()`（函数里的 `err = e` 会和栈帧形成引用环，见[第 12 章](ch12.md)）。PyTorch 的 FAQ 给出的也是“把恢复代码移到 `except` 外面”这个做法。
#
# ### 5.2 恢复循环：先减半微批次，减到下限再打开激活检查点
#
# 恢复的策略有一个梯子，从便宜到昂贵：
#
# 1. 微批次减半、累积步数加倍：等效批大小不变，数学上是同一次更新（[第 5 章](ch05.md)、[第 13 章](ch13.md)）；
# 2. 微批次太小（这里设下限为 4）会让 GPU 吃不饱，此时改为打开激活检查点（`model.gradient_checkpointing_enable()`，[第 7 章](ch07.md)），微批次回到原来的大小再试：多花约一次前向的计算，换来激活值大幅减少；
# 3. 都不行就报错，交给人来决定（换更省显存的方法或更大的卡）。
#
# 每次 OOM 后的清理顺序：离开 `except` → 丢掉握着计算图的局部变量 → `zero_grad(set_to_none=True)` 丢掉这一步已累积的部分梯度 → `gc.collect()` → `empty_cache()` → 整步重做。成功的配置会沿用到后面的步（不必每步都重新 OOM 一次）。
#
# 虚拟显卡 128 MiB，每次更新 32 个样本；前 3 步序列长度 128，第 4 步来了一批长度 512 的长序列，之后又回到 128。

# %%
def update_with_recovery(model, opt, ids, plan, dev, min_micro=4):
    """用 ids 做一次参数更新。plan = {"micro": 微批次, "ckpt": 是否检查点}，OOM 时按梯子修改 plan 并整步重做。"""
    n, events = ids.shape[0], []
    while True:
        if plan["ckpt"] and not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        oom, loss, total = False, None, 0.0
        try:
            for chunk in ids.split(plan["micro"]):
                loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
                loss.backward()
                total += loss.item()
                loss = None
            opt.step()
        except torch.OutOfMemoryError:
            oom = True                                   # 只做标记
        if not oom:
            opt.zero_grad(set_to_none=True)
            return total, events
        events.append(f"试 {plan['micro']}×{n // plan['micro']}{'+检查点' if plan['ckpt'] else ''}：OOM")
        loss = chunk = None                              # 离开 except 之后再清理
        opt.zero_grad(set_to_none=True)
        gc.collect()
        dev.empty_cache()
        if plan["micro"] // 2 >= min_micro:
            plan["micro"] //= 2
        elif not plan["ckpt"]:
            plan.update(micro=n, ckpt=True)
        else:
            raise RuntimeError("打开检查点、微批次减到下限仍放不下：需要更省显存的方法或更大的卡")


SEQS = [128, 128, 128, 512, 128, 128]


def train_recovering(card):
    rows = []
    with vramlab.device_budget(card) if card else vramlab.open_device("auto") as dev:
        model = build_model(MODEL, device=dev.torch_device)
        init = dev.to_host(torch.cat([p.detach().flatten() for p in model.parameters()]))   # 副本放主存，不占虚拟显卡
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plan = {"micro": 32, "ckpt": False}
        for step, seq in enumerate(SEQS, 1):
            ids = make_ids(32, seq, dev.torch_device, seed=100 + step)
            dev.reset_peak()
            loss, events = update_with_recovery(model, opt, ids, plan, dev)
            rows.append((step, seq, loss, dict(plan), events, dev.max_allocated()))
        params = dev.to_host(torch.cat([p.detach().flatten() for p in model.parameters()]))
        del model, opt
    return rows, params, init


rec_rows, rec_params, init_params = train_recovering("128 MiB")
ref_rows, ref_params, _ = train_recovering(None)          # 对照：不限显存，微批次始终 32
print(pad("步", 4) + pad("序列", 6) + pad("最终配置", 16) + pad("峰值 MiB", 10) + pad("对照峰值 MiB", 14)
      + pad("损失", 12) + pad("对照的损失", 12) + "恢复过程")
for (step, seq, loss, plan, events, peak), ref in zip(rec_rows, ref_rows):
    cfg = f"{plan['micro']}×{32 // plan['micro']}" + ("+检查点" if plan["ckpt"] else "")
    print(pad(str(step), 4) + pad(str(seq), 6) + pad(cfg, 16) + pad(f"{mib(peak):.1f}", 10) + pad(f"{mib(ref[5]):.1f}", 14)
          + pad(f"{loss:.6f}", 12) + pad(f"{ref[2]:.6f}", 12) + ("直接通过" if not events else f"{len(events)} 次 OOM 后通过"))
    for ev in events:
        print(" " * 50 + "· " + ev)
moved = (ref_params - init_params).abs().max().item()
diff = (rec_params - ref_params).abs().max().item()
print(f"\n6 步之后，参数与对照的最大差 {diff:.2e}；同期参数自身的最大变化 {moved:.2e}（差约为变化的 {diff / moved:.1%}）")
publish("recovery_param_max_diff", f"{diff:.2e}")
publish("recovery_diff_share", f"{diff / moved:.1%}")
publish("rec_card_mib", 128)
publish("rec_step1_micro", rec_rows[0][3]["micro"])
long_step = SEQS.index(max(SEQS))
publish("rec_long_micro", rec_rows[long_step][3]["micro"])
publish("rec_long_ckpt", "+ 检查点" if rec_rows[long_step][3]["ckpt"] else "（不用检查点）")
publish("rec_long_ooms", len(rec_rows[long_step][4]))
publish("rec_long_peak_mib", mib(rec_rows[long_step][5]), fmt="{:.1f}")
publish("rec_after_peak_mib", mib(max(r[5] for r in rec_rows[long_step + 1:])), fmt="{:.1f}")
publish("ref_first_peak_mib", mib(ref_rows[0][5]), fmt="{:.1f}")
publish("ref_short_peak_mib", mib(max(r[5] for r in ref_rows[1:] if r[1] == min(SEQS))), fmt="{:.1f}")
publish("ref_long_peak_mib", mib(ref_rows[long_step][5]), fmt="{:.1f}")
loss_diff = max(abs(round(a[2], 6) - round(b[2], 6)) for a, b in zip(rec_rows, ref_rows))
publish("rec_loss_max_diff", f"{loss_diff:.0e}")
publish("rec_loss_max_diff_units", round(loss_diff * 1e6))       # 第 6 位小数上差几

# %% [markdown]
# 第 1 步：微批次 32 和 16 都放不下，减到 8 通过，之后两步沿用 8×4（8 个样本一个微批次，累积 4 次）。第 4 步来了长序列：微批次 8 放不下，减到 4 还是放不下，已到下限，于是打开激活检查点、微批次回到 32 重新往下减，最后以“微批次 4 + 检查点”通过。之后的短序列沿用这个配置，不再 OOM。
#
# 损失与不受限的对照只在第 6 位小数上偶有差别：微批次的损失和梯度是分块求和的，加法的顺序变了。6 步之后参数的差只有参数自身变化量的千分之几（AdamW 按梯度的相对大小更新，会把舍入差放大一点）。所以恢复循环改变的只是“怎么算”，不是“算什么”。再看“对照峰值”一列：不限显存时，短序列的一步要 200 多 MiB，长度 512 的一步要 700 多 MiB；恢复循环让同样的更新挤进了 128 MiB。
#
# 这个循环还可以更聪明：配置一旦退到检查点，短序列的步也一直付着重算的代价；可以像[第 13 章](ch13.md)那样，连续成功若干步后试着退回更便宜的配置；也可以按序列长度分别记住各自的配置。多卡训练时，退让必须所有进程一起做（先用一次 `all_reduce` 汇总“谁 OOM 了”），否则别的进程会停在下一次集合通信上等它。
