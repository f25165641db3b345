# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 第 3 章 动手教程：模型加载优化
#
# 这份教程把第 3 章讲的几件事逐一量出来：
#
# 1. 不同存储格式（FP32 / FP16 / BF16 / INT8）每个参数占几个字节、能表示多大的数；
# 2. 同一个模型的三种“造法”——先 FP32 再转 BF16、直接按 BF16 构建、在 meta 设备上构建再 `to_empty`——峰值显存差多少；
# 3. 把权重存成 `torch.save` 文件和 safetensors 文件，分别用普通方式、`mmap=True` 读回来，主存（host memory）里发生了什么；
# 4. 分片检查点（sharded checkpoint）逐片加载时，显存和主存的峰值各是多少。
#
# 代码用 `vramlab.open_device("auto")`：有 NVIDIA GPU 时在真显卡上测，没有时在 CPU 上的模拟设备上测。
# 模拟设备上的显存数字是确定的；主存数字来自操作系统（`/proc/self/status`），每台机器会略有不同。

# %%
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import unicodedata
from pathlib import Path

import torch
import transformers

import vramlab
from vramlab.models import build_model, count_params
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB



def cell(text, width, left=False):
    """按显示宽度补空格（一个汉字占两格），让中文表格对齐。"""
    text = str(text)
    w = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return text + " " * (width - w) if left else " " * (width - w) + text


try:
    import safetensors
    from safetensors.torch import load_file, save_file
    HAVE_SAFETENSORS = True
except ImportError:                      # safetensors 随 transformers 一起安装，一般都有
    HAVE_SAFETENSORS = False

with vramlab.open_device("auto") as _dev:
    BACKEND = "NVIDIA " + torch.cuda.get_device_name(0) if _dev.backend == "cuda" else "CPU 上的模拟设备"
print("运行环境")
print(f"  后端          : {BACKEND}")
print(f"  PyTorch       : {torch.__version__}")
print(f"  transformers  : {transformers.__version__}")
print(f"  safetensors   : {safetensors.__version__ if HAVE_SAFETENSORS else '未安装'}")
print(f"  Python        : {platform.python_version()}（{platform.machine()}）")
print(f"  日期          : {datetime.date.today().isoformat()}")
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("safetensors", safetensors.__version__ if HAVE_SAFETENSORS else "未安装")

# %% [markdown]
# ## 1. 存储格式：每个参数几个字节，能表示多大的数
#
# `torch.finfo` / `torch.iinfo` 给出每种数据类型的字节数、最大值和精度（`eps`：1 与比 1 大的下一个可表示数之差）。
# 注意 FP16 的最大值只有 65504，而 BF16 与 FP32 一样能到 $3.4 \times 10^{38}$：BF16 用 8 位指数，只砍了尾数。

# %%
rows = []
for name, dt in [("FP32", torch.float32), ("FP16", torch.float16), ("BF16", torch.bfloat16)]:
    fi = torch.finfo(dt)
    rows.append((name, fi.bits // 8, f"{fi.max:.4g}", f"{fi.tiny:.4g}", f"{fi.eps:.4g}"))
ii = torch.iinfo(torch.int8)
rows.append(("INT8", 1, str(ii.max), "-", "1（整数步长）"))
W = (6, 10, 12, 12, 16)
print("".join(cell(h, w, i == 0) for i, (h, w) in enumerate(zip(["格式", "字节/参数", "最大值", "最小正规数", "eps"], W))))
for r in rows:
    print("".join(cell(v, w, i == 0) for i, (v, w) in enumerate(zip(r, W))))

# %% [markdown]
# 一个数超出 FP16 的范围会变成 `inf`，BF16 则只是丢掉一些有效数字：

# %% tags=["convert"]
x = torch.tensor([70000.0, 1e-8, 1.0 + 1 / 512])
print("原值 (FP32):", x.tolist())
print("转成 FP16  :", x.to(torch.float16).float().tolist())
print("转成 BF16  :", x.to(torch.bfloat16).float().tolist())

# %% [markdown]
# INT8 只有 256 个整数，要表示权重得配一个缩放系数（scale）。最简单的做法是**逐输出通道的绝对值最大量化**
# （per-channel absmax）：每一行权重找最大绝对值 $a$，令 scale $= a / 127$，再把 $w / \text{scale}$ 四舍五入成整数。
# 下面对 gpt2-mini 的一个 MLP 权重做一次，看看占多少字节、误差多大（这里的 scale 用 FP32 存）。

# %%
torch.manual_seed(0)
mini = build_model("gpt2-mini")                     # 在 CPU 上建一个 FP32 的 gpt2-mini，只用来取一个权重
w = mini.transformer.h[0].mlp.c_fc.weight.detach().T.contiguous()   # GPT-2 的 Conv1D 存的是转置，转成 [out, in]
scale = w.abs().amax(dim=1, keepdim=True) / 127     # 每个输出通道一个 scale
q = torch.clamp(torch.round(w / scale), -127, 127).to(torch.int8)
w_hat = q.float() * scale                           # 反量化
bytes_int8 = q.numel() * 1 + scale.numel() * 4
rel_err = ((w_hat - w).norm() / w.norm()).item()
print(f"权重形状 {tuple(w.shape)}，{w.numel():,} 个参数")
print(f"  FP32        : {w.numel() * 4:>10,} 字节")
print(f"  BF16        : {w.numel() * 2:>10,} 字节，相对误差 {((w.bfloat16().float() - w).norm() / w.norm()).item():.2e}")
print(f"  INT8 + scale: {bytes_int8:>10,} 字节（{scale.numel()} 个 FP32 scale），相对误差 {rel_err:.2e}")
bf16_err = ((w.bfloat16().float() - w).norm() / w.norm()).item()
publish("int8_bytes", f"{bytes_int8:,}")
mantissa, exponent = f"{rel_err:.2e}".split("e")
publish("int8_rel_err", f"{mantissa} \\times 10^{{{int(exponent)}}}")
publish("int8_vs_bf16_err", rel_err / bf16_err, fmt="{:.1f}")
del mini, w, q, w_hat, scale

# %% [markdown]
# 把这些字节数乘到整个模型上（参数量由 `count_params` 在 meta 设备上精确算出，不占内存）：

# %%
print(cell("模型", 12, True) + cell("参数量", 16) + cell("FP32 GiB", 10) + cell("BF16 GiB", 10) + cell("INT8 GiB", 10))
for name in ["gpt2-mini", "gpt2-small", "gpt2-medium", "llama-7b"]:
    n = count_params(name)
    print(f"{name:<12}{n:>16,}{n * 4 / 2**30:>10.2f}{n * 2 / 2**30:>10.2f}{n * 1 / 2**30:>10.2f}")
    for dtype, nbytes in (("fp32", 4), ("bf16", 2), ("int8", 1)):
        publish(f"{name.replace('-', '_')}_{dtype}_gib", n * nbytes / 2**30, fmt="{:.2f}")
print("（INT8 一列不含 scale；算术结果，1 GiB = 2**30 字节）")

# %% [markdown]
# ## 2. 三种造法的峰值显存
#
# 同一个 gpt2-mini（3887 万参数，随机初始化，种子相同），最终都要得到一个 BF16 模型：
#
# - **(1) 先 FP32 再转换**：`build_model(..., device=dev)` 建 FP32，再 `.to(torch.bfloat16)`；
# - **(2) 直接按 BF16 构建**：`build_model(..., dtype=torch.bfloat16, device=dev)`；
# - **(3) meta 设备 + `to_empty`**：在 meta 设备上建（只有形状，没有数据），再 `to_empty` 在设备上分配未初始化的显存，最后 `tie_weights()` 恢复权重共享。
#
# meta 张量不占任何内存，在哪里建都一样；这里把它放在设备上下文外面建。

# %%
NAME = "gpt2-mini"
results = {}      # 名称 -> (峰值, 最终已分配, 参数字节数, 时间线)


def param_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def record(label, dev, model):
    tl = [e["allocated"] for e in dev.snapshot()["timeline"]]
    results[label] = (dev.max_allocated(), dev.allocated(), param_bytes(model), tl)


with vramlab.open_device("auto") as dev:
    dev.reset_peak()
    m = build_model(NAME, device=dev.torch_device)          # FP32，种子 0
    m = m.to(torch.bfloat16)
    record("(1) FP32 后转 BF16", dev, m)
    values_1 = {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
    del m

with vramlab.open_device("auto") as dev:
    dev.reset_peak()
    m = build_model(NAME, dtype=torch.bfloat16, device=dev.torch_device)
    record("(2) 直接 BF16", dev, m)
    values_2 = {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
    del m

with torch.device("meta"):
    meta_model = build_model(NAME, dtype=torch.bfloat16)
print("meta 模型的参数：", meta_model.transformer.wte.weight.device, meta_model.transformer.wte.weight.dtype)
with vramlab.open_device("auto") as dev:
    dev.reset_peak()
    m = meta_model.to_empty(device=dev.torch_device)
    tied_after_to_empty = m.lm_head.weight is m.transformer.wte.weight
    m.tie_weights()
    record("(3) meta + to_empty", dev, m)
    del m, meta_model

print("to_empty 之后 lm_head 与词嵌入还是同一个张量吗？", tied_after_to_empty)
same = all(torch.equal(values_1[k], values_2[k]) for k in values_1)
print("(1) 与 (2) 的参数值完全相同吗？", same)

# %%
def table(labels):
    base = results[labels[0]][2]
    print(cell("方式", 24, True) + cell("峰值 MiB", 10) + cell("结束时 MiB", 12) + cell("BF16 权重 MiB", 15)
          + cell("峰值/权重", 11))
    for k in labels:
        peak, final, wbytes, _ = results[k]
        print(cell(k, 24, True) + cell(f"{peak / MiB:.1f}", 10) + cell(f"{final / MiB:.1f}", 12)
              + cell(f"{wbytes / MiB:.1f}", 15) + cell(f"{peak / wbytes:.2f}", 11))


table(["(1) FP32 后转 BF16", "(2) 直接 BF16", "(3) meta + to_empty"])

# %% [markdown]
# 为什么 (2) 和 (3) 也超过了 1.0 倍？GPT-2 的输出层 `lm_head` 与词嵌入 `wte` **共享权重**（tied weights）。
# transformers 构建模型时先给 `lm_head` 单独分配一个 `[vocab, hidden]` 的矩阵，`post_init()` 里再把它指向 `wte`，
# 所以构建过程中有一刻存着两份词嵌入；gpt2-mini 的词表有 50257 个词，词嵌入占了参数的大头，这一份多余的矩阵就很显眼。
# `to_empty` 则会给两个模块各分配一块显存（它们在 meta 上共享的关系被拆开了），直到 `tie_weights()` 才释放多出来的那一份。
# 下图是三种方式的“已分配显存”时间线（横轴是第几次分配/释放事件，虚线是最终的 BF16 权重大小）；(2) 和 (3) 的曲线几乎重合。

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = next((f.name for f in font_manager.fontManager.ttflist if f.name in ("Noto Sans CJK SC", "Noto Sans CJK JP")), None)
if CJK:
    plt.rcParams["font.family"] = CJK
plt.rcParams["axes.unicode_minus"] = False

fig, ax = plt.subplots(figsize=(8, 3.6))
labels_en = {"(1) FP32 后转 BF16": "(1) FP32 -> .to(bf16)", "(2) 直接 BF16": "(2) build in bf16",
             "(3) meta + to_empty": "(3) meta + to_empty + tie_weights"}
styles = {"(1) FP32 后转 BF16": dict(lw=1.5), "(2) 直接 BF16": dict(lw=3, alpha=0.6),
          "(3) meta + to_empty": dict(lw=1.2, ls="--", color="black")}
for k, (peak, final, wbytes, tl) in results.items():
    if tl:
        ax.plot([t / MiB for t in tl], label=(k if CJK else labels_en[k]), **styles[k])
if results["(2) 直接 BF16"][3]:
    ax.axhline(results["(2) 直接 BF16"][2] / MiB, color="gray", ls="--", lw=1)
    ax.set_xlabel("分配 / 释放事件序号" if CJK else "allocation event #")
    ax.set_ylabel("已分配显存 (MiB)" if CJK else "allocated (MiB)")
    ax.set_title("gpt2-mini 的三种构建方式" if CJK else "gpt2-mini: three ways to build")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
else:
    print("真 GPU 上没有逐次分配的时间线（需要 torch.cuda.memory._record_memory_history），只看上面的表。")

# %% [markdown]
# ## 3. 把权重存到磁盘：`torch.save` 与 safetensors
#
# 先在主存里建一个 BF16 的 gpt2-mini（这就是我们要加载的“预训练权重”），分别存成：
#
# - `model.pt`：`torch.save(state_dict)`，zip 包里装着 pickle 和各个张量的字节；
# - `model.safetensors`：`safetensors.torch.save_file`，一个 JSON 头加一段连续的原始字节；
# - `sharded/`：Hugging Face 风格的分片 safetensors，外加 `model.safetensors.index.json`；
# - `sharded_bin/`：同样分片，但每片用 `torch.save` 存（老式的 `pytorch_model-0000x-of-0000N.bin`）。
#
# safetensors 不允许两个名字共享同一块存储，所以存之前去掉与 `wte` 共享的 `lm_head.weight`，加载后再 `tie_weights()`。

# %%
from huggingface_hub import save_torch_state_dict, split_torch_state_dict_into_shards

work = Path(tempfile.mkdtemp(prefix="vramlab-ch03-"))
src = build_model(NAME, dtype=torch.bfloat16)               # 主存上的 BF16 模型，种子 0
state = {k: v.contiguous() for k, v in src.state_dict().items() if k != "lm_head.weight"}
del src
torch.save(state, work / "model.pt")
if HAVE_SAFETENSORS:
    save_file(state, str(work / "model.safetensors"))
    (work / "sharded").mkdir()
    save_torch_state_dict(state, str(work / "sharded"), max_shard_size="20MB")

# 老式 .bin 分片：同样的切分，每片用 torch.save
split = split_torch_state_dict_into_shards(state, filename_pattern="pytorch_model{suffix}.bin", max_shard_size="20MB")
(work / "sharded_bin").mkdir()
for fname, names in split.filename_to_tensors.items():
    torch.save({n: state[n] for n in names}, work / "sharded_bin" / fname)
(work / "sharded_bin" / "pytorch_model.bin.index.json").write_text(
    json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, indent=2))

total = sum(v.numel() * v.element_size() for v in state.values())
print(f"state_dict 里 {len(state)} 个张量，共 {total / MiB:.1f} MiB（BF16）")
for p in sorted(work.rglob("*")):
    if p.is_file():
        print(f"  {str(p.relative_to(work)):<52}{p.stat().st_size / MiB:>8.1f} MiB")
publish("checkpoint_mib", total / MiB, fmt="{:.1f}")
publish("checkpoint_bytes", f"{total:,}")
publish("wte_mib", state["transformer.wte.weight"].nbytes / MiB, fmt="{:.2f}")
if HAVE_SAFETENSORS:
    publish("first_shard_mib", (work / "sharded" / "model-00001-of-00003.safetensors").stat().st_size / MiB, fmt="{:.1f}")

# %% [markdown]
# 分片索引文件长这样（节选）：`weight_map` 告诉加载器每个张量在哪一片里，`total_size` 是所有张量的字节数。

# %% tags=["index"]
if HAVE_SAFETENSORS:
    index = json.loads((work / "sharded" / "model.safetensors.index.json").read_text())
    print(json.dumps(index["metadata"]))
    for k in list(index["weight_map"])[:4]:
        print(f"  {k:<40} -> {index['weight_map'][k]}")
    print(f"  ……共 {len(index['weight_map'])} 项，{len(set(index['weight_map'].values()))} 个分片")

# %% [markdown]
# ## 4. 读回来时主存里发生了什么
#
# 主存用量由操作系统统计。为了不受本进程里其他东西干扰，每种读法都在一个**新的 Python 进程**里跑，
# 读 `/proc/self/status` 里的三个数：
#
# - `RssAnon`：匿名内存，即进程自己申请的堆内存。普通 `torch.load` 把张量字节复制到这里。
# - `RssFile`：映射进来的文件页。它们就是内核的页缓存（page cache），干净的文件页在内存紧张时可以直接丢掉、以后再从磁盘读，多个进程映射同一个文件时也只占一份。
# - `VmHWM`：常驻内存（RSS = 匿名 + 文件页 + 共享内存）的历史峰值。
#
# 每个进程先“加载”，记一次；再把所有张量读一遍（求和，模拟拷到显卡上），再记一次。
# 文件刚写过，都在页缓存里，所以这里测的是主存占用，不是磁盘速度。这些数字只在 Linux 上有。

# %%
PROBE = textwrap.dedent(r'''
    import json, sys, torch
    def status():
        out = {}
        for line in open("/proc/self/status"):
            k, v = line.split(":", 1)
            if k in ("RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
        return out
    how, path = sys.argv[1], sys.argv[2]
    try:                                # 把 VmHWM（峰值 RSS）清零，只看下面这段代码的峰值
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        pass
    before = status()
    def touch(sd):                      # 读一遍每个张量（代替“拷到显卡上”），按原类型求和，不产生大的临时张量
        return sum(float(t.sum()) for t in sd.values())
    if how == "plain":
        sd = torch.load(path, weights_only=True)
    elif how == "mmap":
        sd = torch.load(path, mmap=True, weights_only=True)
    elif how == "safetensors":
        from safetensors.torch import load_file
        sd = load_file(path)
    elif how == "shards":               # 逐片加载：读一片、用完、释放，再读下一片
        import os
        index = json.load(open(os.path.join(path, "pytorch_model.bin.index.json")))
        sd = {}
    loaded = status()
    if how == "shards":
        for shard in sorted(set(index["weight_map"].values())):
            part = torch.load(os.path.join(path, shard), weights_only=True)
            touch(part)
            del part
    else:
        touch(sd)
    done = status()
    print(json.dumps({"before": before, "loaded": loaded, "done": done}))
''')


def probe(how, path):
    out = subprocess.run([sys.executable, "-c", PROBE, how, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


cases = [("torch.load(model.pt)", "plain", work / "model.pt"),
         ("torch.load(model.pt, mmap=True)", "mmap", work / "model.pt")]
if HAVE_SAFETENSORS:
    cases.append(("safetensors load_file", "safetensors", work / "model.safetensors"))
cases.append(("torch.load 逐片（.bin 分片）", "shards", work / "sharded_bin"))

HOST = {}
if sys.platform.startswith("linux"):
    print("单位 MiB，都是相对于加载前的增量")
    print(cell("读法", 34, True) + cell("加载后匿名", 11) + cell("加载后文件页", 13) + cell("读完后匿名", 11)
          + cell("读完后文件页", 13) + cell("峰值 RSS", 10))
    for label, how, path in cases:
        r = probe(how, path)
        HOST[how] = r

        def d(stage, key):
            return f"{(r[stage][key] - r['before'][key]) / MiB:.1f}"
        print(cell(label, 34, True) + cell(d("loaded", "RssAnon"), 11) + cell(d("loaded", "RssFile"), 13)
              + cell(d("done", "RssAnon"), 11) + cell(d("done", "RssFile"), 13) + cell(d("done", "VmHWM"), 10))
        for stage, key, name in (("loaded", "RssAnon", "loaded_anon"), ("loaded", "RssFile", "loaded_file"),
                                 ("done", "RssAnon", "done_anon"), ("done", "RssFile", "done_file"), ("done", "VmHWM", "peak_rss")):
            publish(f"host_{how}_{name}_mib", (r[stage][key] - r["before"][key]) / MiB, fmt="{:.1f}")
else:
    print("这一节读 /proc/self/status，只在 Linux 上有数字。")

# %% [markdown]
# 怎么读这张表：
#
# - 每一行“读完后文件页”里都有几 MiB 是 PyTorch 自己的代码库被读进来的页，与检查点无关（普通 `torch.load` 那一行的读数就是它，
#   多少因机器而异），比较时把它扣掉；
# - 普通 `torch.load` 一返回，整个文件的张量字节（约 74 MiB）就已经复制进了匿名内存；
# - `mmap=True` 返回时匿名内存几乎没涨，张量字节等到被访问时才按页读入；读完一遍后 RSS 同样涨了约 74 MiB，
#   但涨的是**文件页**（页缓存），不是匿名内存；
# - safetensors 的 `load_file` 在 CPU 上同样是映射文件，表现与 `mmap=True` 一致；
# - 逐片读 `.bin`：每片读进匿名内存、用完就释放，峰值 RSS 由**最大的一片**决定。这里最大的一片就是词嵌入 `wte`（约 49 MiB），
#   一个张量不会被拆到两片里，所以分片救不了单个巨大的张量。

# %% [markdown]
# ## 5. 分片检查点 + meta 设备：逐片加载到显存
#
# 这才是加载大模型的完整流程：在 meta 设备上建模型（不占内存）→ 按索引文件逐片读（mmap）→ 每个张量直接搬上设备 →
# `load_state_dict(part, strict=False, assign=True)` 让模型的参数**就是**这些张量 → 最后 `tie_weights()`。
# 设备上从头到尾只有一份 BF16 权重。
#
# 在主存上做类型转换、再拷到设备，是为了让设备上不出现 FP32 的临时张量；这里的检查点本来就是 BF16，`.to()` 不会复制。

# %% tags=["ways"]
def load_sharded(model, folder, dev, dtype=torch.bfloat16):
    """把分片检查点逐片装进 meta 设备上的 model。"""
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        with dev.host():                                   # 在主存上：读分片（mmap，不复制）、转类型
            part = load_file(str(Path(folder) / shard))
            part = {k: v.to(dtype) for k, v in part.items()}
        part = {k: dev.to_device(v) for k, v in part.items()}   # 一片一片地搬上设备
        model.load_state_dict(part, strict=False, assign=True)
        del part
    model.tie_weights()
    return model


if HAVE_SAFETENSORS:
    with torch.device("meta"):
        skeleton = build_model(NAME, dtype=torch.bfloat16)
    with vramlab.open_device("auto") as dev:
        dev.reset_peak()
        m = load_sharded(skeleton, work / "sharded", dev)
        record("(4) meta + 逐片 assign", dev, m)
        left_on_meta = [n for n, p in m.named_parameters() if p.device.type == "meta"]
        loaded_values = {k: v.detach().to("cpu", copy=True) for k, v in m.state_dict().items()}
        del m, skeleton
    print("还留在 meta 上的参数：", left_on_meta or "无")
    print("与 (2) 直接 BF16 构建的参数值完全相同吗？",
          all(torch.equal(loaded_values[k], values_2[k]) for k in values_2))
    table(["(1) FP32 后转 BF16", "(2) 直接 BF16", "(3) meta + to_empty", "(4) meta + 逐片 assign"])
    for k, (peak, final, wbytes, _) in results.items():
        publish(f"way{k[1]}_peak_mib", peak / MiB, fmt="{:.1f}")        # "(1) …" -> way1_…
        publish(f"way{k[1]}_ratio", peak / wbytes, fmt="{:.2f}")
    publish("bf16_weights_mib", wbytes / MiB, fmt="{:.1f}")

# %% [markdown]
# ## 6. 放大到 7B：只看形状的模拟
#
# 在 `SimDevice(fake=True)` 下，张量只有形状没有数据，Llama-2-7B 形状的模型也能在笔记本上“构建”出来。
# 这一节只在模拟设备上运行（真 GPU 上没有 fake 模式）。Llama 的输出层不与词嵌入共享权重，
# 所以直接按 BF16 构建时没有那份多余的矩阵。

# %%
print(cell("模型", 12, True) + cell("方式", 18, True) + cell("峰值 MiB", 10) + cell("BF16 权重 MiB", 15) + cell("峰值/权重", 11))
for name in ["gpt2-small", "llama-7b"]:
    for label, kw, convert in [("FP32 后转 BF16", {}, True), ("直接 BF16", {"dtype": torch.bfloat16}, False)]:
        with vramlab.SimDevice(fake=True) as dev:
            m = build_model(name, device=dev.torch_device, **kw)
            if convert:
                m = m.to(torch.bfloat16)
            wb = param_bytes(m)
            print(cell(name, 12, True) + cell(label, 18, True) + cell(f"{dev.max_allocated() / MiB:.1f}", 10)
                  + cell(f"{wb / MiB:.1f}", 15) + cell(f"{dev.max_allocated() / wb:.2f}", 11))
            key = f"{name.replace('-', '_')}_{'fp32_then_bf16' if convert else 'bf16'}"
            publish(f"fake_{key}_peak_mib", dev.max_allocated() / MiB, fmt="{:.1f}")
            publish(f"fake_{key}_ratio", dev.max_allocated() / wb, fmt="{:.2f}")
            if not convert:
                publish(f"fake_{name.replace('-', '_')}_weights_mib", wb / MiB, fmt="{:.1f}")
            del m

# %% [markdown]
# ## 小结
#
# - 峰值显存只取决于“同一时刻设备上有哪些张量”。FP32 建好再转 BF16，转换的那一刻 FP32 和 BF16 两份都在。
# - 直接按目标类型构建、或者在 meta 设备上构建再逐个张量赋值，设备上只会出现一份目标类型的权重。
# - 共享权重（GPT-2 的 `lm_head`/`wte`）会让构建过程或 `to_empty` 多出一份大矩阵，别忘了 `tie_weights()`。
# - `mmap=True` 和 safetensors 让主存里只有被访问到的文件页，而且是可回收的页缓存；普通 `torch.load` 则把整个文件复制进匿名内存。
# - 分片加载让主存峰值由最大的一片决定；一个超大张量（比如词嵌入）自己就是一片。

# %%
import shutil

shutil.rmtree(work, ignore_errors=True)
print("临时目录已删除：", work)
