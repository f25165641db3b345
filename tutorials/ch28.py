# %% [markdown]
# # 第 28 章 动手实践：把张量挪到主存，显存省多少、要搬多少字节
#
# 这份教程配合[第 28 章 模型卸载（Offloading）](ch28.md)，用 `vramlab` 回答四个问题：
#
# 1. 激活值卸载（`save_on_cpu`）能让 GPT-2 small 的峰值降多少？每一步要在显存和主存之间搬多少字节？模拟设备能否复现 H200 参考表里的这一行？
# 2. “聪明一点”的卸载：不搬权重、只卸载检查点的输入、把优化器状态放到主存，各省多少显存、各搬多少字节？
# 3. 推理时逐层加载权重（weight streaming）：显存里只留一两层，预取下一层要多付多少显存？
# 4. 卸载怎样与计算重叠？（模拟设备不计时间，这一节用算术画时间线，并给出在真卡上运行的代码。）
#
# 模拟设备的规则很简单：在 `dev.host()` 里创建、或经 `dev.to_host()` 拷出的张量属于**主存**，不计入显存；`dev.to_device()` 拷回来的是新的显存张量。`dev.save_on_cpu()` 就是用这两个函数写成的 `saved_tensors_hooks`。有 NVIDIA GPU 时，`vramlab.open_device("auto")` 会换成真卡，同样的代码调用的是 `torch.autograd.graph.save_on_cpu(pin_memory=True)` 和锁页内存上的拷贝。
#
# 模拟设备只记账、不计时：下面所有“毫秒”都是用带宽算出来的，不是测出来的。

# %%
import contextlib
import datetime
import functools
import math

import matplotlib.pyplot as plt
import torch
import transformers

import vramlab
from vramlab.display import banner, mib, pad, use_cjk_font
from vramlab.models import build_model, count_params, get_preset
from vramlab.reference import reference_rows
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU          # GPT-2 small 的训练在模拟设备上用 FakeTensorMode（只有形状、没有数据）
ZH = use_cjk_font()        # 没有中文字体时图里只用英文标签，避免出现方框
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 激活值卸载：`save_on_cpu` 到底搬了什么
#
# `torch.autograd.graph.save_on_cpu` 是一对“保存张量钩子”（`saved_tensors_hooks`）：前向里 autograd 每要为反向保存一个张量，就调用 `pack`，它把张量拷到主存、返回主存里的副本；反向用到时调用 `unpack`，再拷回显存。下面的 `Traffic` 做的是同一件事，只是顺手数一数搬了多少字节。它还有一个开关 `skip`：属于这些存储（storage）的张量（比如模型参数）原样留在显存，不搬。
#
# 判断“是不是参数”要按**存储**比，不能用 `isinstance(t, nn.Parameter)`：`nn.Linear` 为反向保存的是 `weight.t()`，它是一个普通的视图张量，和参数共用存储。

# %%
def storage_key(t):
    """张量背后那块存储的身份（视图与原张量相同）。"""
    return t.untyped_storage()._cdata


class Traffic:
    """数一数显存 ↔ 主存之间搬了多少字节。pack/unpack 与 dev.save_on_cpu() 的实现相同。"""

    def __init__(self, dev, skip=()):
        self.dev, self.skip = dev, set(skip)
        self.reset()

    def reset(self):
        self.d2h = self.h2d = self.n_packed = 0

    # 显存 -> 主存（真卡上：拷进锁页内存）
    def to_host(self, t):
        self.d2h += t.numel() * t.element_size()
        return self.dev.to_host(t)

    # 主存 -> 显存（真卡上：non_blocking 的拷贝）
    def to_device(self, t):
        self.h2d += t.numel() * t.element_size()
        return self.dev.to_device(t)

    def copy_into(self, dst, src):          # 主存 -> 已有的显存张量（不新分配）
        self.h2d += src.numel() * src.element_size()
        dst.copy_(src)

    def pack(self, t):
        if storage_key(t) in self.skip:
            return ("device", t)             # 参数本来就常驻显存：只保存引用，不搬
        self.n_packed += 1
        return ("host", self.to_host(t))

    def unpack(self, packed):
        where, t = packed
        return t if where == "device" else self.to_device(t)

    def save_on_cpu(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


# %% [markdown]
# 验证上面那句话：给一个 `nn.Linear` 做前向，看 autograd 为反向保存了什么。

# %%
lin = torch.nn.Linear(4, 3)
seen = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
    lin(torch.randn(2, 4, requires_grad=True)).sum()
for t in seen:
    print(f"保存了形状 {tuple(t.shape)} 的张量：是 nn.Parameter 吗？{isinstance(t, torch.nn.Parameter)}；"
          f"与 lin.weight 共用存储吗？{storage_key(t) == storage_key(lin.weight)}")

# %% [markdown]
# 先在一个小模型上（`tiny`，真实张量）确认三件事：`Traffic` 与 `dev.save_on_cpu()` 的峰值相同；卸载后损失和更新与不卸载完全一样；已分配显存确实降了。训练步里只有前向包在 `with ...save_on_cpu():` 里，反向会自动调用保存时登记的 `unpack`。

# %%
def tiny_run(kind):
    torch.manual_seed(0)
    with vramlab.open_device("auto") as dev:
        model = build_model("tiny", device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 1024, (4, 128), generator=torch.Generator().manual_seed(1)).to(dev.torch_device)
        tr = Traffic(dev)
        ctx = {"none": contextlib.nullcontext, "dev": dev.save_on_cpu, "traffic": tr.save_on_cpu}[kind]
        losses = []
        for i in range(3):
            if i == 1:
                dev.reset_peak()
                tr.reset()
            with ctx():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        acts = dev.breakdown().get("activations", 0)
        params = [p.detach().to("cpu").clone() for p in model.parameters()]
        return dict(peak=dev.max_allocated(), acts=acts, losses=losses, params=params, d2h=tr.d2h / 2)


tiny = {k: tiny_run(k) for k in ("none", "dev", "traffic")}
print(pad("tiny，batch 4，序列 128", 34), pad("稳态峰值 MiB", 14), pad("其中激活值 MiB", 16), pad("三步损失", 26), "参数与不卸载的最大差")
for k, label in [("none", "不卸载"), ("dev", "dev.save_on_cpu()"), ("traffic", "Traffic（同样的钩子，带计数）")]:
    r = tiny[k]
    diff = max((a - b).abs().max().item() for a, b in zip(r["params"], tiny["none"]["params"]))
    print(pad(label, 34), pad(f"{mib(r['peak']):.1f}", 14), pad(f"{mib(r['acts']):.1f}", 16),
          pad(" ".join(f"{x:.4f}" for x in r["losses"]), 26), f"{diff:.1e}")
print(f"\n每步从显存搬到主存：{mib(tiny['traffic']['d2h']):.1f} MiB（反向时同样多的字节搬回来）")
for k in ("none", "dev", "traffic"):
    publish(f"tiny_{k}_peak_mib", mib(tiny[k]["peak"]), fmt="{:.1f}")
publish("tiny_d2h_mib", mib(tiny["traffic"]["d2h"]), fmt="{:.1f}")
publish("tiny_max_param_diff", f"{max(max((a - b).abs().max().item() for a, b in zip(tiny[k]['params'], tiny['none']['params'])) for k in ('dev', 'traffic')):.1e}")
publish("tiny_same_losses", "逐位相同" if tiny["dev"]["losses"] == tiny["none"]["losses"] == tiny["traffic"]["losses"] else "不完全相同")

# %% [markdown]
# 这个小模型的峰值里还有两个 32 MiB 的 cuBLAS 工作区（前向线程和反向线程各一个），它们不随卸载变化；看“激活值”这一列更清楚。损失和参数逐位相同：卸载只改变张量**住在哪里**，不改变计算。
#
# ### GPT-2 small：复现 H200 参考表
#
# H200 参考表（`vramlab/data/h200_gpt2_peaks.md`，PyTorch 2.11.0+cu130，2026-11-29）里有一对只差激活值卸载的配置：GPT-2 small，FP32，AdamW，批大小 8，序列 512，`small_fp32_adamw_b8_s512` 与 `small_fp32_adamw_b8_s512_saveoncpu`（`torch.autograd.graph.save_on_cpu(pin_memory=True)`）。下面在 FakeTensorMode 下跑同样的两步（第 1 步热身，读第 2 步的峰值），并用 `Traffic` 数出每步的传输量。`train_run` 还支持后面几节要用的开关。

# %%
REF = {r.name: r for r in reference_rows()}   # vramlab/data/h200_gpt2_peaks.md
H200 = {"none": REF["small_fp32_adamw_b8_s512"].steady_mib, "act": REF["small_fp32_adamw_b8_s512_saveoncpu"].steady_mib,
        "ckpt": REF["small_fp32_adamw_b8_s512_ckpt"].steady_mib}
for k, name in (("none", "small_fp32_adamw_b8_s512"), ("act", "small_fp32_adamw_b8_s512_saveoncpu"),
                ("ckpt", "small_fp32_adamw_b8_s512_ckpt")):
    publish(f"h200_{k}_mib", REF[name].steady_mib)
    publish(f"h200_{k}_ms", REF[name].step_ms, fmt="{:.1f}")


class HostAdamW:
    """优化器状态卸载（ZeRO-Offload 的数据流）：FP32 主权重、m、v 和更新都在主存。
    梯度在反向里一算好就搬到主存、显存里的梯度立刻释放；step 后把新参数拷回显存。"""

    def __init__(self, model, dev, traffic, **adamw):
        self.dev, self.tr = dev, traffic
        self.params = [p for p in model.parameters() if p.requires_grad]
        with dev.host():
            self.master = [dev.to_host(p) for p in self.params]        # 真卡上是锁页内存里的 CPU 张量
            self.opt = torch.optim.AdamW(self.master, **adamw)
        for p, w in zip(self.params, self.master):
            p.register_post_accumulate_grad_hook(functools.partial(self._grad_ready, w))

    def _grad_ready(self, w, p):
        w.grad = self.tr.to_host(p.grad)           # 显存 -> 主存，与反向的其余部分同时进行（真卡上用另一条流）
        p.grad = None                              # 显存里的梯度马上释放

    @torch.no_grad()
    def step(self):
        with self.dev.host():
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        for p, w in zip(self.params, self.master):
            self.tr.copy_into(p, w)                # 主存 -> 显存，写回原来的参数


def offload_block_inputs(model, traffic):
    """检查点 + 只卸载每个 block 的输入：与 transformers 5.17 的 gradient_checkpointing_enable(offload=True)
    构造的函数相同（在 save_on_cpu 里调用 checkpoint），只是换成了计数的钩子。"""
    for block in model.transformer.h:
        inner = block._gradient_checkpointing_func        # gradient_checkpointing_enable() 设好的 checkpoint

        def offloaded(function, *args, _inner=inner):
            with traffic.save_on_cpu():
                return _inner(function, *args)
        block._gradient_checkpointing_func = offloaded


def train_run(mode=(), name="gpt2-small", batch=8, seq=512, fake=FAKE):
    """mode 里的开关：act 整个前向卸载；skipw 不卸载参数；ckpt 激活检查点；
    blocks 只卸载每个检查点 block 的输入；opt 优化器状态卸载。"""
    with vramlab.open_device("auto", fake=fake) as dev:
        model = build_model(name, device=dev.torch_device)
        ids = torch.randint(0, get_preset(name).vocab, (batch, seq),
                            generator=torch.Generator().manual_seed(1)).to(dev.torch_device)
        skip = {storage_key(p) for p in model.parameters()} if "skipw" in mode else ()
        tr = Traffic(dev, skip=skip)
        if "ckpt" in mode:
            model.gradient_checkpointing_enable()   # transformers 5.17：默认非重入的 torch.utils.checkpoint
        if "blocks" in mode:
            offload_block_inputs(model, tr)
        if "opt" in mode:
            host_opt = HostAdamW(model, dev, tr, lr=1e-4)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        offload = tr.save_on_cpu if "act" in mode else contextlib.nullcontext

        def step():
            with offload():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if "opt" in mode:
                host_opt.step()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)

        step()                      # 热身：AdamW 的状态、cuBLAS 工作区都在第 1 步创建
        dev.reset_peak()
        tr.reset()
        step()
        snap = dev.snapshot()
        return dict(peak=dev.max_allocated(), bd=dev.breakdown(), where=snap["peak_where"],
                    timeline=snap["timeline"], d2h=tr.d2h, h2d=tr.h2d, n=tr.n_packed)


runs = {}
runs["A"] = train_run(())
runs["B"] = train_run(("act",))
for key, row in (("A", "none"), ("B", "act")):
    r = runs[key]
    dev_pct = (mib(r["peak"]) - H200[row]) / H200[row] * 100
    print(f"{key}  模拟设备 {mib(r['peak']):7.1f} MiB   H200 {H200[row]} MiB   偏差 {dev_pct:+.2f}%   峰值位置 {r['where']}")
print(f"\nB 每步：显存 -> 主存 {mib(runs['B']['d2h']):.1f} MiB，主存 -> 显存 {mib(runs['B']['h2d']):.1f} MiB，"
      f"共 {runs['B']['n']} 个保存的张量")
publish("b_n_packed", runs["B"]["n"])
publish("b_d2h_gib", runs["B"]["d2h"] / 2**30, fmt="{:.1f}")
publish("b_oneway_ms", runs["B"]["d2h"] / 63e9 * 1e3, fmt="{:.0f}")
publish("ab_max_dev", max(abs(mib(runs[k]["peak"]) - H200[row]) / H200[row] for k, row in (("A", "none"), ("B", "act"))), fmt="{:.2%}")

# %% [markdown]
# 峰值时刻的组成（MiB）：

# %%
CATS = ["parameters", "gradients", "optimizer_state", "activations", "temporaries", "cuda_overhead"]
ZH_CAT = {"parameters": "参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
          "temporaries": "临时张量", "cuda_overhead": "cuBLAS 工作区"}


def print_breakdown(keys, labels):
    print(pad("方案", 36), *(pad(ZH_CAT[c], 12) for c in CATS))
    for k in keys:
        bd = runs[k]["bd"]
        print(pad(labels[k], 36), *(pad(f"{mib(bd.get(c, 0)):.1f}", 12) for c in CATS))


LABELS = {"A": "A 不卸载", "B": "B save_on_cpu（全部保存的张量）", "C": "C 同 B，但参数不搬",
          "D": "D 激活检查点", "E": "E 检查点 + 整个前向卸载", "F": "F 检查点 + 只卸载 block 输入",
          "G": "G 优化器状态卸载（主存 AdamW）", "H": "H = F + G"}
print_breakdown(["A", "B"], LABELS)
for k in "AB":
    publish(f"{k.lower()}_act_mib", mib(runs[k]["bd"].get("activations", 0)), fmt="{:.1f}")

# %% [markdown]
# 两种做法的峰值都出现在反向刚开始（对 log-softmax 求梯度）。不卸载时，那一刻 4.7 GiB 的激活值都还在；卸载后激活值几乎为 0，剩下的大头是临时张量：FP32 的 logits 一份就是 $8 \times 512 \times 50257 \times 4$ 字节 ≈ 785 MiB，log-softmax 的输出和它的梯度同时存在。B 的临时张量比 A 多了约一份 logits，因为被卸载的 log-softmax 输出此刻刚被拷回来，成了一份新的显存张量。激活值卸载碰不到这些临时张量，想再往下降，要靠分块计算损失（[第 15 章](ch15.md)）之类的办法。
#
# 代价是传输量：每一步在每个方向上都要搬 6 GiB 多。下一节先看看这些字节里有多少是白搬的。

# %% [markdown]
# ## 2. 智能卸载：先搬哪些、不搬哪些
#
# 在同一个配置上再试几种做法，各测一次：
#
# - **C：参数不搬。** 线性层为反向保存了权重；权重本来就常驻显存，拷到主存再拷回来省不下一个字节，只多了传输（反向时还多出一份权重大小的临时副本）。PyTorch 自带的 `save_on_cpu` 不做区分；torchtune 的 `OffloadActivations` 会跳过参数和缓冲区。
# - **D、E、F：与激活检查点组合。** 检查点（[第 7 章](ch07.md)）让每个 block 只保存输入，反向时重算其余部分。E 在整个前向外面套卸载钩子：block 的输入被卸载，block 之后的输出层、损失保存的张量也被卸载。F 只给每个 block 的检查点套钩子，和 `model.gradient_checkpointing_enable(offload=True)`（transformers 5.17）的做法相同。
# - **G、H：优化器状态放到主存。** 前向、反向完全不变，AdamW 的 $m$、$v$、主权重和更新都在主存（[第 19 章](ch19.md)细讲过），梯度在反向里一算好就搬走。

# %%
runs["C"] = train_run(("act", "skipw"))
runs["D"] = train_run(("ckpt",))
runs["E"] = train_run(("ckpt", "act", "skipw"))
runs["F"] = train_run(("ckpt", "blocks"))
runs["G"] = train_run(("opt",))
runs["H"] = train_run(("ckpt", "blocks", "opt"))

PCIE5_GBps = 63.0                               # PCIe 5.0 x16 单向，算术（第 1 章）
base = runs["A"]["peak"]
print(pad("方案（GPT-2 small，FP32，b8 s512）", 36), pad("峰值 MiB", 10), pad("与 A 之比", 10),
      pad("每步 D2H MiB", 14), pad("每步 H2D MiB", 14), "单向传输至少 ms（PCIe 5.0）")
for k in "ABCDEFGH":
    r = runs[k]
    ms = r["d2h"] / 1e9 / PCIE5_GBps * 1e3
    print(pad(LABELS[k], 36), pad(f"{mib(r['peak']):.1f}", 10), pad(f"{r['peak'] / base:.2f}", 10),
          pad(f"{mib(r['d2h']):.1f}", 14), pad(f"{mib(r['h2d']):.1f}", 14), f"{ms:.1f}")
for k in "ABCDEFGH":
    r = runs[k]
    publish(f"{k.lower()}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"{k.lower()}_ratio", r["peak"] / base, fmt="{:.2f}")
    publish(f"{k.lower()}_d2h_mib", mib(r["d2h"]), fmt="{:.1f}")
publish("d_vs_h200_ckpt", abs(mib(runs["D"]["peak"]) - H200["ckpt"]) / H200["ckpt"], fmt="{:.2%}")
publish("b_minus_c_d2h_mib", mib(runs["B"]["d2h"] - runs["C"]["d2h"]), fmt="{:.1f}")
publish("param_fp32_mib", count_params("gpt2-small") * 4 / 2**20, fmt="{:.1f}")
publish("f_minus_e_peak_mib", mib(runs["F"]["peak"] - runs["E"]["peak"]), fmt="{:.0f}")
publish("e_over_f_d2h", runs["E"]["d2h"] / runs["F"]["d2h"], fmt="{:.0f}")
publish("e_minus_f_d2h_gib", (runs["E"]["d2h"] - runs["F"]["d2h"]) / 2**30, fmt="{:.1f}")

# %% [markdown]
# 峰值时刻的组成：

# %%
print_breakdown("CDEFGH", LABELS)
for k in "CDEFGH":
    publish(f"{k.lower()}_act_mib", mib(runs[k]["bd"].get("activations", 0)), fmt="{:.1f}")
    publish(f"{k.lower()}_opt_mib", mib(runs[k]["bd"].get("optimizer_state", 0)), fmt="{:.1f}")

# %% [markdown]
# 读这两张表：
#
# - B 和 C 的峰值相同，C 每步少搬了约一份参数（GPT-2 small 的 FP32 参数是 474.7 MiB）：不搬参数是白捡的。
# - D 单靠检查点已经把激活值压到 1 GiB 以内。E、F 在它之上再卸载：两者的峰值只差 24 MiB，传输量却差了 10 倍。F 搬的主要是 12 个 block 的输入（每个 $8 \times 512 \times 768 \times 4$ 字节 = 12 MiB）；E 多搬的那部分几乎都是输出层和损失为反向保存的张量，它们在前向的最后才产生、在反向的最开始就要用，峰值恰好落在那一刻，卸载它们几乎省不下峰值，只是白白来回搬一趟。F 的峰值里剩下的 812 MiB 激活值就是这些张量。
# - G 的传输量与批大小、序列长度无关，每步只有“一份梯度下去、一份参数上来”；它省下的正是常驻的优化器状态。H 把 F 和 G 叠起来，峰值降到 A 的 0.37，剩下的是参数、输出层附近为反向保存的张量和损失的临时张量。
#
# 把“每搬 1 字节换来多少字节的峰值”算出来，排序就很清楚了（每一对只差一种卸载，分母是单向传输量）：

# %%
PAIRS = [("B", "A", "全部激活值（save_on_cpu）"), ("C", "A", "全部激活值，参数不搬"),
         ("E", "D", "检查点之上，整个前向卸载"), ("F", "D", "检查点之上，只卸载 block 输入"),
         ("G", "A", "优化器状态")]
print(pad("卸载的对象", 32), pad("省下的峰值 MiB", 16), pad("单向传输 MiB", 14), "每搬 1 MiB 省下 MiB")
for k, ref_key, label in PAIRS:
    saved = runs[ref_key]["peak"] - runs[k]["peak"]
    print(pad(label, 32), pad(f"{mib(saved):.1f}", 16), pad(f"{mib(runs[k]['d2h']):.1f}", 14),
          f"{saved / runs[k]['d2h']:.2f}")
    publish(f"save_per_mib_{k.lower()}", saved / runs[k]["d2h"], fmt="{:.2f}")

# %% [markdown]
# 再把传输量换成时间：H200 上这个配置一步是 87.0 ms（参考表实测）。B 每个方向 100 ms 以上，比整步计算还长，就算拷贝与计算完美重叠也藏不住，何况 `save_on_cpu` 的拷贝就排在计算流上；参考表里这一行每步从 87.0 ms 变成 346.2 ms，与此相符。G 每个方向不到 10 ms，放到另一条流上与反向重叠，完全藏得住。
#
# 下图是 A、B、F、H 两个训练步里已分配显存的变化（横轴是分配/释放事件的序号，不是时间）。

# %%
EN = {"A": "A no offload", "B": "B save_on_cpu (all)", "F": "F checkpoint + offload block inputs", "H": "H = F + optimizer offload"}
fig, ax = plt.subplots(figsize=(9, 3.8))
for k in "ABFH":
    ys = [mib(e["allocated"]) for e in runs[k]["timeline"]]
    ax.plot(range(len(ys)), ys, lw=0.9, label=LABELS[k] if ZH else EN[k])
ax.set_xlabel("分配/释放事件序号（2 个训练步）" if ZH else "allocation event (2 training steps)")
ax.set_ylabel("已分配显存 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("GPT-2 small，FP32，b8 s512：卸载前后的显存时间线" if ZH else "GPT-2 small, FP32, b8 s512: allocated memory with and without offload")
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()
plt.show()
publish("a_tl_max_mib", max(mib(e["allocated"]) for e in runs["A"]["timeline"]), fmt="{:.1f}")
publish("bfh_tl_max_mib", max(mib(e["allocated"]) for k in "BFH" for e in runs[k]["timeline"]), fmt="{:.0f}")

# %% [markdown]
# ## 3. 推理时逐层加载权重：只留一两层在显存里
#
# 模型大到连权重都放不进显存时，推理还可以把权重留在主存，**每算一层才把这一层搬上来**，算完就丢掉。Hugging Face Accelerate 的 `cpu_offload(model, execution_device)` 和 `device_map="auto"` 里被分到 `"cpu"` 的那些层就是这么做的：给每个模块挂一个前向钩子，进模块之前把权重搬上执行设备，出来之后释放。
#
# 下面用同样的思路写一个 `WeightStreamer`：每个 `GPT2Block` 的权重放在主存（在 `dev.host()` 里建模型），嵌入层和最后的 LayerNorm 常驻显存（词嵌入还兼做输出层，头尾都要用）。`prefetch=k` 表示进入第 $i$ 层时顺便把第 $i+1 \dots i+k$ 层也搬上来：在真卡上，这些拷贝放在另一条 CUDA 流上，与第 $i$ 层的计算同时进行（第 4 节），代价是显存里多留 $k$ 层。先用真实张量的 `tiny` 确认输出不变，再在 24 层的 GPT-2 medium 上（模拟设备上用 FakeTensorMode）看显存。

# %%
class WeightStreamer:
    """前向钩子：进入第 i 层前把它（以及之后 prefetch 层）的权重拷上设备，出来后换回主存副本。"""

    def __init__(self, dev, blocks, prefetch=0, traffic=None):
        self.dev, self.blocks, self.prefetch = dev, list(blocks), prefetch
        self.tr = traffic or Traffic(dev)
        self.host = [{n: p.data for n, p in b.named_parameters()} for b in self.blocks]   # 主存里的权重
        self.on_device, self.max_resident = set(), 0
        self.handles = []
        for i, b in enumerate(self.blocks):
            self.handles.append(b.register_forward_pre_hook(functools.partial(self._pre, i)))
            self.handles.append(b.register_forward_hook(functools.partial(self._post, i)))

    def _load(self, i):
        if i < len(self.blocks) and i not in self.on_device:
            for n, p in self.blocks[i].named_parameters():
                p.data = self.tr.to_device(self.host[i][n])
            self.on_device.add(i)
            self.max_resident = max(self.max_resident, len(self.on_device))

    def _pre(self, i, module, args):
        self._load(i)                                   # 预取过就什么也不做
        for j in range(i + 1, i + 1 + self.prefetch):
            self._load(j)

    def _post(self, i, module, args, output):
        for n, p in self.blocks[i].named_parameters():
            p.data = self.host[i][n]                    # 显存里的副本没有引用了，立即释放
        self.on_device.discard(i)

    def remove(self):
        for h in self.handles:
            h.remove()


def stream_compare(name, fake, batch=1, seq=256):
    """同一个模型、同一批输入，四种放权重的方式各做一次前向。"""
    with vramlab.open_device("auto", fake=fake) as dev:
        with dev.host():                                # 整个模型先建在主存里
            model = build_model(name).eval()
        blocks = model.transformer.h
        block_ids = {id(p) for b in blocks for p in b.parameters()}
        for p in model.parameters():                    # 词嵌入、位置嵌入、ln_f 常驻显存
            if id(p) not in block_ids:
                p.data = dev.to_device(p.data)
        host = [{n: p.data for n, p in b.named_parameters()} for b in blocks]
        ids = torch.randint(0, get_preset(name).vocab, (batch, seq),
                            generator=torch.Generator().manual_seed(2)).to(dev.torch_device)
        info = dict(block=sum(p.numel() * p.element_size() for p in blocks[0].parameters()),
                    resident=dev.allocated(), layers=len(blocks))
        rows = {}
        for label, prefetch in [("全部常驻", None), ("逐层，不预取", 0), ("逐层，预取 1 层", 1), ("逐层，预取 2 层", 2)]:
            tr = Traffic(dev)
            if prefetch is None:                        # 对照：所有层一次全搬上来
                for b, h in zip(blocks, host):
                    for n, p in b.named_parameters():
                        p.data = tr.to_device(h[n])
            else:
                streamer = WeightStreamer(dev, blocks, prefetch=prefetch, traffic=tr)
            start = len(dev.snapshot()["timeline"])
            dev.reset_peak()
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            peak = dev.max_allocated()
            timeline = dev.snapshot()["timeline"][start:]
            out = dev.to_host(logits)                   # 结果拷到主存保存，不占显存
            del logits
            if prefetch is None:
                for b, h in zip(blocks, host):          # 换回主存里的权重，显存里的副本释放
                    for n, p in b.named_parameters():
                        p.data = h[n]
                resident = len(blocks)
            else:
                streamer.remove()
                resident = streamer.max_resident
            rows[label] = dict(peak=peak, h2d=tr.h2d, resident=resident, out=out, timeline=timeline)
    return rows, info


# 先在真实张量的小模型上确认：逐层加载不改变输出
# %% tags=["stream"]
check, _ = stream_compare("tiny", fake=False, seq=128)
ref = check["全部常驻"]["out"]
print("tiny（真实张量）logits 与全部常驻的最大差：",
      "，".join(f"{k} {(r['out'] - ref).abs().max().item():.1e}" for k, r in check.items() if k != "全部常驻"))

# 再在 GPT-2 medium（24 层）上看显存
stream_rows, info = stream_compare("gpt2-medium", fake=FAKE)
print(f"\nGPT-2 medium：每个 GPT2Block 的 FP32 权重 {mib(info['block']):.1f} MiB，共 {info['layers']} 层；"
      f"常驻部分（词嵌入、位置嵌入、ln_f）{mib(info['resident']):.1f} MiB\n")
print(pad("方案（GPT-2 medium 推理，b1 s256）", 36), pad("峰值 MiB", 10), pad("同时在显存的层数", 18), "每次前向 H2D MiB")
for label, r in stream_rows.items():
    print(pad(label, 36), pad(f"{mib(r['peak']):.1f}", 10), pad(str(r["resident"]), 18), f"{mib(r['h2d']):.1f}")
publish("stream_tiny_maxdiff", f"{max((r['out'] - ref).abs().max().item() for k, r in check.items() if k != '全部常驻'):.1e}")
publish("stream_block_mib", mib(info["block"]), fmt="{:.1f}")
publish("stream_layers", info["layers"])
publish("stream_resident_mib", mib(info["resident"]), fmt="{:.1f}")
SK = {"全部常驻": "all", "逐层，不预取": "pf0", "逐层，预取 1 层": "pf1", "逐层，预取 2 层": "pf2"}
for label, r in stream_rows.items():
    publish(f"stream_{SK[label]}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"stream_{SK[label]}_layers", r["resident"])
publish("stream_h2d_mib", mib(stream_rows["逐层，不预取"]["h2d"]), fmt="{:.1f}")
steps = [round(mib(stream_rows[b]["peak"]), 1) - round(mib(stream_rows[a]["peak"]), 1)
         for a, b in (("逐层，不预取", "逐层，预取 1 层"), ("逐层，预取 1 层", "逐层，预取 2 层"))]
publish("stream_prefetch_step_mib", f"{min(steps):.1f}" if f"{min(steps):.1f}" == f"{max(steps):.1f}" else f"{min(steps):.1f}–{max(steps):.1f}")
streamed = [mib(e["allocated"]) for k in ("逐层，不预取", "逐层，预取 1 层", "逐层，预取 2 层") for e in stream_rows[k]["timeline"]]
publish("stream_tl_min_mib", min(streamed), fmt="{:.0f}")
publish("stream_tl_max_mib", max(streamed), fmt="{:.0f}")
publish("stream_all_tl_max_mib", max(mib(e["allocated"]) for e in stream_rows["全部常驻"]["timeline"]), fmt="{:.0f}")

# %% [markdown]
# 逐层加载把 24 层权重（1153.2 MiB）换成了“同时只有 1 到 3 层”，输出不变（上面 `tiny` 的最大差是 0）；每多预取一层，峰值就多一层权重（48.1 MiB）。每次前向要搬的字节却不变：所有块的权重每次前向都要过一遍 PCIe。这就是推理卸载的根本代价：批大小为 1 的自回归生成每产生一个 token 都要把所有层搬一遍，速度由 PCIe 带宽决定，而不是由 GPU 算力决定（第 4 节有算式）。
#
# 下图是四种方案一次前向的已分配显存时间线：全部常驻是一条高而平的线；逐层加载是一排锯齿，每个齿是一层权重进来、算完、出去。

# %%
EN_S = {"全部常驻": "all resident", "逐层，不预取": "streamed, no prefetch", "逐层，预取 1 层": "streamed, prefetch 1",
        "逐层，预取 2 层": "streamed, prefetch 2"}
fig, ax = plt.subplots(figsize=(9, 3.6))
for label, r in stream_rows.items():
    ys = [mib(e["allocated"]) for e in r["timeline"]]
    ax.plot(range(len(ys)), ys, lw=1, label=label if ZH else EN_S[label])
ax.set_xlabel("分配/释放事件序号（一次前向）" if ZH else "allocation event (one forward pass)")
ax.set_ylabel("已分配显存 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("GPT-2 medium 推理：逐层加载权重" if ZH else "GPT-2 medium inference: streaming the weights layer by layer")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 4. 与计算重叠：用算术画时间线
#
# 在真卡上，拷贝由 DMA 引擎完成，和 SM 上的计算可以同时进行，前提是两者在**不同的 CUDA 流**上、源数据在锁页内存里。预取的时间线是这样的：计算流在算第 $i$ 层时，拷贝流已经在搬第 $i+1$ 层；只要一层的计算时间不短于一层的拷贝时间，拷贝就完全藏在计算后面。
#
# 下面用算术画两种情形（示意，不是测量）：一个 Llama-7B 的解码器层，BF16 权重 $4h^2 + 3 h h_{\text{ffn}}$ 个参数（$h = 4096$、$h_{\text{ffn}} = 11008$），经 PCIe 5.0 x16（约 63 GB/s）上传；计算按 H200 的 BF16 稠密峰值约 989 TFLOPS 算，每个 token 每个参数 2 FLOPs（只算矩阵乘）。

# %%
H, FFN = 4096, 11008
layer_params = 4 * H * H + 3 * H * FFN
copy_ms = layer_params * 2 / (PCIE5_GBps * 1e9) * 1e3
PEAK_TFLOPS = 989.0
for tokens in (2048, 16384):
    comp = 2 * layer_params * tokens / (PEAK_TFLOPS * 1e12) * 1e3
    print(f"每层 {layer_params / 1e6:.1f}M 参数，BF16 {layer_params * 2 / 1e6:.1f} MB：拷贝 {copy_ms:.2f} ms；"
          f"{tokens} 个 token 的计算 {comp:.2f} ms")
print(f"拷贝与计算持平所需的 token 数 ≈ 989e12 / 63e9 = {PEAK_TFLOPS * 1e12 / (PCIE5_GBps * 1e9):,.0f}")
publish("llama_layer_yi", layer_params / 1e8, fmt="{:.3f}")
publish("llama_layer_mb", layer_params * 2 / 1e6, fmt="{:.1f}")
publish("llama_copy_ms", copy_ms, fmt="{:.2f}")
for tokens in (2048, 16384):
    publish(f"llama_comp_{tokens}_ms", 2 * layer_params * tokens / (PEAK_TFLOPS * 1e12) * 1e3, fmt="{:.2f}")
publish("llama_breakeven_tokens", f"{PEAK_TFLOPS * 1e12 / (PCIE5_GBps * 1e9):,.0f}")


def gantt(ax, comp_ms, copy_ms, layers=4, prefetch=True, title=""):
    t_copy_end, t_comp_end = 0.0, 0.0
    for i in range(layers):
        c0 = t_copy_end if prefetch else max(t_copy_end, t_comp_end)
        c1 = c0 + copy_ms
        ax.broken_barh([(c0, copy_ms)], (0.6, 0.8), color="tab:orange", edgecolor="white")
        ax.text(c0 + copy_ms / 2, 1.0, f"L{i}", ha="center", va="center", fontsize=7)
        k0 = max(c1, t_comp_end)
        ax.broken_barh([(k0, comp_ms)], (1.6, 0.8), color="tab:blue", edgecolor="white")
        ax.text(k0 + comp_ms / 2, 2.0, f"L{i}", ha="center", va="center", fontsize=7, color="white")
        t_copy_end, t_comp_end = c1, k0 + comp_ms
    ax.set_yticks([1.0, 2.0])
    ax.set_yticklabels(["拷贝流" if ZH else "copy stream", "计算流" if ZH else "compute stream"])
    ax.set_title(f"{title}：{t_comp_end:.1f} ms" if ZH else f"{title}: {t_comp_end:.1f} ms", fontsize=9)
    return t_comp_end


fig, axes = plt.subplots(2, 2, figsize=(10, 4.4), sharex="col")
for col, tokens in enumerate((2048, 16384)):
    comp = 2 * layer_params * tokens / (PEAK_TFLOPS * 1e12) * 1e3
    for row, pf in enumerate((False, True)):
        name = ("预取" if pf else "不预取") if ZH else ("prefetch" if pf else "no prefetch")
        total = gantt(axes[row][col], comp, copy_ms, prefetch=pf, title=f"{tokens} tokens, {name}")
        publish(f"gantt_{tokens}_{'pf' if pf else 'nopf'}_ms", total, fmt="{:.1f}")
    axes[1][col].set_xlabel("时间 (ms，算术示意)" if ZH else "time (ms, arithmetic sketch)")
fig.suptitle("Llama-7B 的 4 层逐层加载：PCIe 5.0 x16 与 H200 BF16 峰值算力（算术，非实测）" if ZH else
             "Streaming 4 Llama-7B layers: PCIe 5.0 x16 vs H200 BF16 peak (arithmetic, not measured)", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# 左边 2048 个 token：每层计算不到 1 ms，拷贝要 6.4 ms，预取也救不了，总时间几乎就是拷贝时间之和（拷贝受限）。右边 16384 个 token：计算比拷贝长，预取让拷贝完全藏在计算后面，只剩第一层的拷贝露在外面。持平点约是 $F/B$ 个 token（$F$ 是算力，$B$ 是 PCIe 带宽）；真实训练达不到峰值算力，持平点会更低一些，但量级不变。
#
# 最后是在真卡上实现预取的代码：拷贝放在单独的流上，计算流用事件（event）等它；在拷贝流上分配、在计算流上用过的张量，释放前要 `record_stream`，否则缓存分配器可能在计算还没结束时就把这块显存交给下一次拷贝。没有 GPU 时这一格只打印一行说明。

# %%
class CudaPrefetchStreamer:
    """真卡上的逐层加载：copy_stream 预取后面的层，计算流等事件；权重在锁页内存里。"""

    def __init__(self, blocks, prefetch=1):
        self.blocks, self.prefetch = list(blocks), prefetch
        self.copy_stream = torch.cuda.Stream()
        self.host = [{n: p.data.to("cpu").pin_memory() for n, p in b.named_parameters()} for b in self.blocks]
        for b, h in zip(self.blocks, self.host):
            for n, p in b.named_parameters():
                p.data = h[n]
        self.ready = {}                                  # 层号 -> 拷贝完成的事件
        for i, b in enumerate(self.blocks):
            b.register_forward_pre_hook(functools.partial(self._pre, i))
            b.register_forward_hook(functools.partial(self._post, i))

    def _load(self, i):
        if i < len(self.blocks) and i not in self.ready:
            with torch.cuda.stream(self.copy_stream):
                for n, p in self.blocks[i].named_parameters():
                    p.data = self.host[i][n].to("cuda", non_blocking=True)
                self.ready[i] = self.copy_stream.record_event()

    def _pre(self, i, module, args):
        self._load(i)
        torch.cuda.current_stream().wait_event(self.ready.pop(i))   # 计算等这一层拷完
        for j in range(i + 1, i + 1 + self.prefetch):
            self._load(j)                                           # 后面的层在拷贝流上同时搬

    def _post(self, i, module, args, output):
        for n, p in self.blocks[i].named_parameters():
            p.data.record_stream(torch.cuda.current_stream())
            p.data = self.host[i][n]


if ON_GPU:
    import time
    gpu_model = build_model("gpt2-medium").eval()
    CudaPrefetchStreamer(gpu_model.transformer.h, prefetch=1)
    for p in gpu_model.parameters():
        if not p.data.is_pinned():
            p.data = p.data.to("cuda")
    x = torch.randint(0, 50257, (8, 1024), device="cuda")
    for _ in range(2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with torch.no_grad():
            gpu_model(input_ids=x)
        torch.cuda.synchronize()
    print(f"GPT-2 medium 逐层加载（预取 1 层）：{(time.perf_counter() - t0) * 1e3:.1f} ms，"
          f"峰值 {mib(torch.cuda.max_memory_allocated()):.1f} MiB")
else:
    print("没有 GPU：CudaPrefetchStreamer 只在真卡上运行（计时也只有在真卡上才有意义）。")

# %% [markdown]
# ## 小结
#
# - `save_on_cpu` 把为反向保存的张量全部搬到主存，GPT-2 small 的峰值几乎减半，但每步每个方向要搬 6 GiB 以上，远超一步的计算时间。
# - 不搬参数；在检查点之上只卸载 block 的输入、不碰输出层和损失，峰值与全部卸载相差无几，传输只有它的几十分之一。优化器状态每搬 1 字节省下约 2 字节，传输量只和参数量有关，是最划算的卸载对象。
# - 推理时逐层加载权重，显存里只留一两层；每多预取一层多占一层的显存，换来拷贝与计算的重叠，而能否藏住拷贝取决于每层处理的 token 数。
