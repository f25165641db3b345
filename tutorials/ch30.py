# %% [markdown]
# # 第 30 章 动手实践：从 OOM 到跑通，一次加一种技术
#
# 这份教程配合[第 30 章 综合调优案例](ch30.md)。任务很具体：在一张 **2 GiB 的虚拟显卡**上训练 GPT-2 small（1.24 亿参数，批大小 8，序列长度 512）。普通的 FP32 + AdamW 训练步要将近 8 GiB，放不下。我们按“速度代价从小到大”的顺序一次加一种技术，每加一种都**量一次**：峰值、峰值时刻按类别的组成、放不放得下；最后用真实张量确认损失没有被改坏。
#
# 1. 先估算：`vramlab.estimate` 在动手之前就告诉我们差多少；
# 2. 基线在虚拟显卡上 OOM，读报错；
# 3. 逐级加技术：BF16 autocast → 8-bit AdamW（bitsandbytes）→ 梯度累积 → 分块交叉熵 → 激活检查点 → 优化器状态卸载 → 激活值卸载；
# 4. 把第一个放得下的配方放到虚拟显卡上真跑；
# 5. 损失还对吗：同样的配方在小模型上用真实张量训练，和 FP32 基线逐步比较；
# 6. 瀑布图与“谁省了多少”的分类账。
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行，所以第 3、4 节只有显存、没有损失；第 5 节用 2 层的 `tiny` GPT-2 和真实张量看损失。模拟设备不计时间，速度代价在正文里用算术讨论。

# %%
import contextlib
import datetime
import logging
import re
import warnings
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.display import banner, mib, pad, use_cjk_font
from vramlab.estimate import PHASE_ZH, estimate
from vramlab.models import build_model, count_params
from vramlab.reference import reference_rows
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.workload import Workload

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # 不打印与本章无关的 4-bit CPU 内核提示
try:
    import bitsandbytes as bnb
except ImportError:            # pip install bitsandbytes
    bnb = None

transformers.logging.set_verbosity_error()       # 不打印与本章无关的配置提示
ON_GPU = banner()
if not ON_GPU:
    torch.set_num_threads(1)   # 共享的 CPU 上单线程反而更快，结果也不随线程数变化
print("bitsandbytes", bnb.__version__ if bnb else "未安装（pip install bitsandbytes）")
FAKE = not ON_GPU              # 模拟设备上 GPT-2 small 用 FakeTensorMode
MiB = 2 ** 20
CARD = 2 * 2 ** 30             # 虚拟显卡：2 GiB（只算分配器的账，不含 CUDA 上下文）
MODEL, B, S = "gpt2-small", 8, 512
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("card_gib", CARD / 2**30, fmt="{:.0f}")
publish("card_mib", CARD / MiB, fmt="{:.0f}")

# %% [markdown]
# ## 0. 一个能组合各种技术的训练步
#
# 整章的技术都落在下面这一个类里。`Recipe` 的每个开关对应课程里的一章，`Trainer.step(ids)` 用一个批次做一次完整的参数更新（评分练习要写的 `train_step` 就是它）：
#
# | 开关 | 做什么 | 见 |
# |---|---|---|
# | `bf16` | 前向和损失放进 `torch.autocast(dev.type, dtype=torch.bfloat16)` | 第 6 章 |
# | `opt8bit` | `bnb.optim.AdamW8bit` 代替 `torch.optim.AdamW` | 第 19 章 |
# | `accum` | 把批次切成 `accum` 个微批次，损失除以 `accum` 再反向 | 第 5 章 |
# | `chunk` | 分块交叉熵：每块 `chunk` 个 token 算 logits 和损失，块包进检查点 | 第 15 章 |
# | `ckpt` | `gradient_checkpointing_enable(use_reentrant=False)` | 第 7 章 |
# | `offload_opt` | AdamW 的状态和更新放在主存；梯度一产生就由钩子搬到主存累加 | 第 19、28 章 |
# | `offload_act` | 前向放进 `dev.save_on_cpu()`：保存的张量存到主存 | 第 28 章 |

# %%
@dataclass(frozen=True)
class Recipe:
    bf16: bool = False
    opt8bit: bool = False
    accum: int = 1
    chunk: int = 0              # 0：不分块，用模型自带的损失
    ckpt: bool = False
    offload_opt: bool = False
    offload_act: bool = False


def chunked_lm_loss(model, ids, chunk):
    """与 model(input_ids=ids, labels=ids).loss 相同的损失，但 logits 一次只算 chunk 个 token（第 15 章）。"""
    h = model.transformer(input_ids=ids).last_hidden_state
    h = h[:, :-1].reshape(-1, h.shape[-1])             # 位置 t 预测 t+1
    y = ids[:, 1:].reshape(-1)
    w = model.lm_head.weight

    def part(hc, yc):
        return F.cross_entropy((hc @ w.t()).float(), yc, reduction="sum")

    total = 0
    for i in range(0, y.numel(), chunk):
        total = total + checkpoint(part, h[i:i + chunk], y[i:i + chunk], use_reentrant=False)
    return total / y.numel()


class Trainer:
    def __init__(self, model, r: Recipe, dev, lr=1e-4):
        self.model, self.r, self.dev = model, r, dev
        if r.ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        params = list(model.parameters())
        if r.offload_opt:                                # 状态和更新在主存（ZeRO-Offload 的思路）
            with dev.host():
                self.host = [dev.to_host(p).requires_grad_() for p in params]   # FP32 主权重
                self.opt = torch.optim.AdamW(self.host, lr=lr)
            for p, hp in zip(params, self.host):
                p.register_post_accumulate_grad_hook(self._grad_to_host(hp))
        elif r.opt8bit:
            self.opt = bnb.optim.AdamW8bit(params, lr=lr)
        else:
            self.opt = torch.optim.AdamW(params, lr=lr)

    def _grad_to_host(self, hp):
        dev = self.dev

        def hook(p):                                     # 这个参数的梯度刚算完：搬走、在主存里累加
            g = dev.to_host(p.grad)
            p.grad = None
            with dev.host():
                hp.grad = g if hp.grad is None else hp.grad.add_(g)
        return hook

    def step(self, ids):
        r, model, dev = self.r, self.model, self.dev
        losses = []
        for mb in ids.chunk(r.accum):                    # 梯度累积：微批次依次前向、反向
            with dev.save_on_cpu() if r.offload_act else contextlib.nullcontext():
                with torch.autocast(dev.type, dtype=torch.bfloat16) if r.bf16 else contextlib.nullcontext():
                    loss = chunked_lm_loss(model, mb, r.chunk) if r.chunk else model(input_ids=mb, labels=mb).loss
                (loss / r.accum).backward()
            losses.append(loss.detach())
            del loss
        if r.offload_opt:
            with dev.host():
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for p, hp in zip(model.parameters(), self.host):
                    p.copy_(dev.to_device(hp))            # 新参数：主存 → 显存
        else:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if getattr(dev, "fake", False):
            return None                                  # FakeTensorMode：没有数值
        return float(sum(x.float() for x in losses) / len(losses))

# %% [markdown]
# ## 1. 先估算
#
# 动手之前先算一笔账。`vramlab.estimate` 用公式估算一个训练步的峰值（与网站上的[显存计算器](../tools/calculator.md)和命令行 `vramlab estimate` 是同一套公式）。它能描述的技术有精度、优化器、梯度累积、检查点和激活值卸载；分块交叉熵和优化器卸载不在它的选项里。

# %%
N = count_params(MODEL)
print(f"{MODEL}：{N:,} 个参数；FP32 + AdamW 的模型状态 16 字节/参数 = {N * 16 / MiB:.1f} MiB（算术）")
print(f"虚拟显卡：{CARD / MiB:.0f} MiB\n")
EST = [("FP32 + AdamW", dict()),
       ("BF16 autocast", dict(precision="bf16-mixed")),
       ("+ 8-bit AdamW", dict(precision="bf16-mixed", optimizer="adamw8bit")),
       ("+ 梯度累积 2×4", dict(precision="bf16-mixed", optimizer="adamw8bit", batch=4, accum=2)),
       ("+ 激活检查点", dict(precision="bf16-mixed", optimizer="adamw8bit", batch=4, accum=2, checkpointing="full"))]
print(pad("配置", 20) + pad("估算峰值 MiB", 14) + pad("峰值时刻", 16) + "最大的一类")
EST_MIB = []
TOP_ZH = {"activations": "激活值", "logits_and_loss": "logits 与损失", "optimizer_state": "优化器状态",
          "parameters": "参数", "gradients": "梯度", "temporaries": "临时张量"}
for i, (name, kw) in enumerate(EST):
    e = estimate(Workload(model=MODEL, batch=kw.pop("batch", B), seq=S, **kw))
    top = max(e.breakdown, key=e.breakdown.get)
    print(pad(name, 20) + pad(f"{mib(e.total_bytes):.1f}", 14) + pad(e.peak_phase, 16)
          + f"{top} {mib(e.breakdown[top]):.1f}")
    EST_MIB.append(mib(e.total_bytes))
    publish(f"est_{i}_mib", mib(e.total_bytes), fmt="{:.1f}")
    publish(f"est_{i}_phase", PHASE_ZH.get(e.peak_phase, e.peak_phase))
    publish(f"est_{i}_top", TOP_ZH.get(top, top))
    publish(f"est_{i}_top_mib", mib(e.breakdown[top]), fmt="{:.1f}")
REF = {r.name: r for r in reference_rows()}     # vramlab/data/h200_gpt2_peaks.md
publish("est_vs_h200", abs(EST_MIB[0] - REF["small_fp32_adamw_b8_s512"].steady_mib) / REF["small_fp32_adamw_b8_s512"].steady_mib, fmt="{:.1%}")
publish("est_over_card", EST_MIB[0] * MiB / CARD, fmt="{:.1f}")
publish("est_0_gib", EST_MIB[0] / 1024, fmt="{:.1f}")

# %% [markdown]
# 估算说得很清楚：基线差了将近 4 倍，峰值在反向开始（`backward_start`），最大的一块是激活值；单靠混合精度或 8-bit 优化器远远不够，把批次切小（梯度累积）再加检查点之后，最大的一块变成了 logits 与损失，仍然高于 2 GiB。估算器的选项里没有分块交叉熵和优化器卸载，剩下的路要靠实测来走。
#
# ## 2. 基线：在虚拟显卡上 OOM
#
# `vramlab.device_budget(CARD)` 打开一张 2 GiB 的虚拟显卡：放不下时抛出和 CUDA 一样的 `torch.OutOfMemoryError`（在 GPU 上它用 `torch.cuda.set_per_process_memory_fraction` 给缓存分配器设上限）。按[第 21 章](ch21.md)的规矩，`except` 里只记下报错文字，离开 `except` 之后再处理。

# %%
def train_on_card(r: Recipe, card=CARD, steps=2):
    """在虚拟显卡上训练 steps 步；返回 (OOM 报错或 None, 已分配峰值, 已保留峰值)。"""
    msg = None
    with vramlab.device_budget(card, fake=FAKE) as dev:
        model = build_model(MODEL, device=dev.torch_device)
        trainer = Trainer(model, r, dev)
        ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
        ids = ids.to(dev.torch_device)
        try:
            for _ in range(steps):
                trainer.step(ids)
        except torch.OutOfMemoryError as e:
            msg = str(e)                               # except 里只做记录
        peak, reserved = dev.max_allocated(), dev.max_reserved()
        del trainer, model, ids
    return msg, peak, reserved


# %% tags=["oom"]
msg, _, _ = train_on_card(Recipe(), steps=1)
print(msg.replace(". ", ".\n") if msg else "没有 OOM？")
if msg:
    publish("oom_request", re.search(r"Tried to allocate ([\d.]+ \w+)", msg).group(1))
    publish("oom_allocated", re.search(r"([\d.]+ \w+) is allocated by PyTorch", msg).group(1))
    publish("oom_unallocated", re.search(r"([\d.]+ \w+) is reserved by PyTorch but unallocated", msg).group(1))
    where = re.search(r"发生在 ([\w.]+)", msg)
    publish("oom_where", where.group(1) if where else "—")

# %% [markdown]
# 第一步的前向还没走完就放不下了。单看“要申请”和“已保留但未分配”两个数，空闲的总量比这次申请还多一点，像是[第 21 章](ch21.md)说的碎片；但“已分配”已经接近 2 GiB，而估算说整个训练步需要近 8 GiB。整理碎片只能让这一次申请成功，几十 MiB 之后照样 OOM：这是“活着的张量真的太多”，调 `PYTORCH_CUDA_ALLOC_CONF` 救不了，只能让活着的张量变少。
#
# ## 3. 一次加一种技术
#
# 每一级在上一级的基础上加一种技术，顺序按速度代价从小到大（理由见正文“多种技术组合”一节）。每一级先在 2 GiB 的虚拟显卡上训练 2 步：跑通了，就记下第 2 步的已分配峰值（第 1 步 AdamW 还没有建状态）和峰值时刻按类别的组成（`dev.breakdown()`）；OOM 了，就在不设上限的设备上再跑一遍，量出它本来需要多少。虚拟显卡判断放不放得下用的是缓存分配器的账：申请不到时先释放缓存、重试，仍不够才 OOM，和 CUDA 一样。
#
# 第 6 级打开优化器卸载时去掉了 8-bit：状态已经在主存里，8 位只省主存，不再省显存（两者重叠），换回 `torch.optim.AdamW` 还能得到与 FP32 AdamW 相同的更新。

# %%
LADDER = [
    ("0 基线 FP32 + AdamW", Recipe()),
    ("1 + BF16 autocast", Recipe(bf16=True)),
    ("2 + 8-bit AdamW", Recipe(bf16=True, opt8bit=True)),
    ("3 + 梯度累积 2×4", Recipe(bf16=True, opt8bit=True, accum=2)),
    ("4 + 分块交叉熵", Recipe(bf16=True, opt8bit=True, accum=2, chunk=512)),
    ("5 + 激活检查点", Recipe(bf16=True, opt8bit=True, accum=2, chunk=512, ckpt=True)),
    ("6 + 优化器卸载", Recipe(bf16=True, accum=2, chunk=512, ckpt=True, offload_opt=True)),
    ("7 + 激活值卸载", Recipe(bf16=True, accum=2, chunk=512, ckpt=True, offload_opt=True, offload_act=True)),
]
CATS = ["parameters", "gradients", "optimizer_state", "activations", "temporaries", "cuda_overhead"]
CAT_ZH = {"parameters": "参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
          "temporaries": "临时张量", "cuda_overhead": "cuBLAS", "other": "其他"}


def measure(r: Recipe, card=None):
    """训练 2 步，返回第 2 步的稳态峰值和峰值时刻的组成；card 给定时在虚拟显卡上跑，放不下返回 OOM 报错。"""
    msg = None
    with vramlab.open_device("auto", fake=FAKE, budget=card, timeline=False) as dev:
        model = build_model(MODEL, device=dev.torch_device)
        trainer = Trainer(model, r, dev)
        ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
        ids = ids.to(dev.torch_device)
        try:
            trainer.step(ids)             # 第 1 步：建优化器状态、cuBLAS 工作区
            dev.reset_peak()
            trainer.step(ids)             # 第 2 步：稳态峰值
        except torch.OutOfMemoryError as e:
            msg = str(e)                  # except 里只做记录
        snap = dev.snapshot()
        bd = dict(snap["breakdown"])
        bd["other"] = sum(v for k, v in bd.items() if k not in CATS)
        out = dict(oom=msg, peak=dev.max_allocated(), reserved=dev.max_reserved(), bd=bd,
                   where=snap["peak_where"].split(" @ ")[-1])
        del trainer, model, ids
    return out


results = {}
print(pad("配置", 22) + pad("2 GiB 卡上", 12) + pad("已分配峰值", 12) + pad("已保留峰值", 12) + pad("比上一级", 10)
      + "".join(pad(CAT_ZH[c], 12) for c in CATS) + "峰值时刻")
prev = None
for name, r in LADDER:
    on_card = measure(r, card=CARD)              # 先在 2 GiB 的卡上跑
    m = results[name] = on_card if on_card["oom"] is None else measure(r)   # 放不下：不设上限再量一次峰值
    m["fits"] = on_card["oom"] is None
    delta = "" if prev is None else f"{mib(m['peak'] - prev):+.0f}"
    print(pad(name, 22) + pad("跑通" if m["fits"] else "OOM", 12) + pad(f"{mib(m['peak']):.1f}", 12)
          + pad(f"{mib(m['reserved']):.1f}", 12) + pad(delta, 10)
          + "".join(pad(f"{mib(m['bd'].get(c, 0)):.1f}", 12) for c in CATS) + m["where"])
    prev = m["peak"]
for i, (name, _) in enumerate(LADDER):
    m = results[name]
    publish(f"lv{i}_peak", mib(m["peak"]), fmt="{:.1f}")
    publish(f"lv{i}_reserved", mib(m["reserved"]), fmt="{:.1f}")
    publish(f"lv{i}_fits", "跑通" if m["fits"] else "OOM")
    for c in CATS:
        publish(f"lv{i}_{c}", mib(m["bd"].get(c, 0)), fmt="{:.1f}")
    if i:
        d = results[LADDER[i - 1][0]]["peak"] - m["peak"]
        publish(f"lv{i}_saved", mib(d), fmt="{:.0f}")
        publish(f"lv{i}_delta", f"{-mib(d):+.0f}".replace("-", "−"))
publish("lv0_peak_gib", mib(results[LADDER[0][0]]["peak"]) / 1024, fmt="{:.1f}")
publish("lv1_cut", 1 - results[LADDER[1][0]]["peak"] / results[LADDER[0][0]]["peak"], fmt="{:.0%}")
publish("lv5_gap_mib", mib(results[LADDER[5][0]]["reserved"] - results[LADDER[5][0]]["peak"]), fmt="{:.0f}")
publish("total_saved", mib(results[LADDER[0][0]]["peak"] - results[LADDER[-1][0]]["peak"]), fmt="{:.1f}")
first_fit = next(i for i, (name, _) in enumerate(LADDER) if results[name]["fits"])
publish("first_fit_level", first_fit)

# %% [markdown]
# 逐级读这张表（数字都在上面的输出里）：
#
# - **BF16 autocast** 只省了约 10%：FP32 的主权重、AdamW 状态、logits（损失前被转回 FP32）都还在，这和 H200 参考表的 7925 → 7141 MiB 一致（[第 6 章](ch06.md)）。
# - **8-bit AdamW** 把优化器状态从约 950 MiB 压到约 250 MiB，省下的正好是状态那一块（[第 19 章](ch19.md)）。
# - **梯度累积**（2 个微批次、每个 4 条）是最大的一刀：激活值和 logits 都减半；代价是梯度要在微批次之间常驻，“梯度”一栏第一次出现（[第 5 章](ch05.md)）。
# - **分块交叉熵**不再一次物化整份 logits，省掉了一部分激活值和临时张量（[第 15 章](ch15.md)）。
# - **激活检查点**把激活值压到几十 MiB（[第 7 章](ch07.md)），已分配峰值第一次低于 2 GiB，**但在卡上仍然 OOM**（下一节细看）。
# - **优化器卸载**把梯度和状态都挪出显存，这一级真正跑通。
# - **激活值卸载**几乎不再省：检查点之后剩下的激活值只是每个 block 的输入，本来就很小。两种技术对付的是同一块显存，叠在一起收益递减。
#
# ## 4. 已分配峰值低于上限，为什么还 OOM
#
# 比较第 5–7 级的已分配峰值和已保留峰值（缓存分配器向驱动要的显存总量，[第 11 章](ch11.md)）：

# %% tags=["margins"]
print(pad("配置", 22) + pad("已分配峰值 MiB", 16) + pad("已保留峰值 MiB", 16) + "余量（卡 − 已保留峰值）MiB")
for name, _ in LADDER[5:]:
    m = results[name]
    print(pad(name, 22) + pad(f"{mib(m['peak']):.1f}", 16) + pad(f"{mib(m['reserved']):.1f}", 16)
          + f"{mib(CARD - m['reserved']):.1f}")
for i in range(5, len(LADDER)):
    margin = mib(CARD - results[LADDER[i][0]]["reserved"])
    publish(f"lv{i}_margin", margin, fmt="{:.0f}")
    publish(f"lv{i}_over", -margin, fmt="{:.0f}")

# %% [markdown]
# 第 5 级的已分配峰值低于 2 GiB，已保留峰值却超过了它：缓存分配器按块取整、按段申请，段里切剩的空闲块装不下新的请求，报 OOM 之前释放缓存、重试也没用。**放得下要看已保留峰值，而不只是已分配峰值。**在真卡上，这正是 `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` 可能有帮助的场景（[第 11 章](ch11.md)；模拟设备没有模拟这个选项）。第 6 级跑通了，但余量只有一百多 MiB，生产环境里序列长度一变、评估或数据加载多占一点就会 OOM；第 7 级用更多的 PCIe 传输换来更宽的余量。选哪一级，取决于你更缺显存还是更缺时间（见正文“性能与显存平衡”）。
#
# ## 5. 损失还对吗
#
# 显存省下来了，训练是否还是原来那个训练？FakeTensorMode 没有数值，所以换成 2 层的 `tiny` GPT-2（隐藏维度 128，词表 1024）用真实张量，按同样的八级配方各训练 6 步（同样的初始权重，每步都用同一批数据，批大小 8、序列长度 128，分块 64 个 token，学习率 $10^{-3}$），与 FP32 基线逐步比较损失。

# %% tags=["losses"]
def losses_of(r: Recipe, steps=6):
    with vramlab.open_device("auto") as dev:
        model = build_model("tiny", device=dev.torch_device, seed=0)
        trainer = Trainer(model, r, dev, lr=1e-3)
        ids = torch.randint(0, 1024, (8, 128), generator=torch.Generator().manual_seed(1)).to(dev.torch_device)
        return [trainer.step(ids) for _ in range(steps)]     # 同一批数据训练几步：损失应当明显下降


TINY = [(name, replace(r, chunk=64 if r.chunk else 0)) for name, r in LADDER]
ref = losses_of(TINY[0][1])
all_losses, max_diff = [], 0.0
print(pad("配置", 22) + "".join(pad(f"第{i + 1}步", 10) for i in range(len(ref))) + "与基线的最大 |Δ损失|")
for name, r in TINY:
    ls = ref if r == TINY[0][1] else losses_of(r)
    diff = max(abs(a - b) for a, b in zip(ls, ref))
    print(pad(name, 22) + "".join(pad(f"{x:.4f}", 10) for x in ls) + f"{diff:.2e}")
    all_losses.append(ls)
    max_diff = max(max_diff, diff)
publish("loss_first", f"{ref[0]:.4f}")
publish("loss_last_span", f"{min(ls[-1] for ls in all_losses):.4f}–{max(ls[-1] for ls in all_losses):.4f}")
publish("loss_max_diff", f"{max_diff:.2e}")

# %% [markdown]
# 同一批数据上，八种配方的损失都从约 6.96 一起降到约 5.86。第 1 步只受前向影响：开了 BF16 的几行与基线相差不到 $10^{-4}$，四舍五入到小数点后 4 位时看不出来。之后几步还叠加了更新的差别：8-bit 状态的量化误差、梯度累积改变了加法顺序、优化器卸载换回了 FP32 AdamW。最后一列是 6 步里与基线差得最多的那一步，都在 $10^{-4}$ 量级，而且没有随步数放大。这就是“损失仍然正确”在实践中的含义：不是逐位相同，而是差别停留在数值精度的量级、不随训练累积。评分练习也按这个思路设容差。
#
# ## 6. 瀑布图：谁省了多少
#
# 把第 3 节每一级峰值时刻的组成画成堆叠柱，红色虚线是 2 GiB 的卡。下面再按类别列出每一级相对上一级的变化：这正是评分器报告里“哪项技术省了多少”的算法。

# %%
import matplotlib.pyplot as plt

CJK = use_cjk_font()
COLORS = {"parameters": "#4c72b0", "gradients": "#55a868", "optimizer_state": "#c44e52", "activations": "#8172b2",
          "temporaries": "#ccb974", "cuda_overhead": "#64b5cd", "other": "#999999"}
CAT_EN = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
          "activations": "activations", "temporaries": "temporaries", "cuda_overhead": "cuBLAS workspace", "other": "other"}
SHORT_EN = ["0 FP32\nbaseline", "1 +BF16\nautocast", "2 +8-bit\nAdamW", "3 +accum\n2x4", "4 +chunked\nloss",
            "5 +ckpt", "6 +optim\noffload", "7 +act\noffload"]
labels = [name.replace(" + ", "\n+") for name, _ in LADDER] if CJK else SHORT_EN
fig, ax = plt.subplots(figsize=(10, 4.8))
x = range(len(LADDER))
bottom = [0.0] * len(LADDER)
for c in CATS + ["other"]:
    vals = [mib(results[name]["bd"].get(c, 0)) for name, _ in LADDER]
    ax.bar(x, vals, bottom=bottom, color=COLORS[c], label=CAT_ZH[c] if CJK else CAT_EN[c])
    bottom = [b + v for b, v in zip(bottom, vals)]
for i, name in enumerate(results):
    ax.text(i, mib(results[name]["peak"]) + 80, f"{mib(results[name]['peak']):.0f}", ha="center", fontsize=8)
ax.axhline(mib(CARD), color="red", ls="--", lw=1)
ax.text(len(LADDER) - 0.5, mib(CARD) + 80, "2 GiB", color="red", ha="right", fontsize=9)
ax.set_xticks(list(x))
ax.set_xticklabels(labels, fontsize=8)
ax.set_ylabel("已分配峰值 MiB" if CJK else "peak allocated (MiB)")
ax.set_title("GPT-2 small, batch 8, seq 512: " + ("逐级加技术后的峰值组成（模拟设备）" if CJK
                                                    else "peak breakdown as techniques are added (simulated device)"))
ax.legend(fontsize=8, ncol=2)
fig.tight_layout()
plt.show()

print(pad("配置", 22) + "".join(pad(CAT_ZH[c], 12) for c in CATS + ["other"]) + "合计")
names = [name for name, _ in LADDER]
for a, b in zip(names, names[1:]):
    d = {c: results[b]["bd"].get(c, 0) - results[a]["bd"].get(c, 0) for c in CATS + ["other"]}
    print(pad(b, 22) + "".join(pad(f"{mib(v):+.1f}", 12) for v in d.values())
          + f"{mib(results[b]['peak'] - results[a]['peak']):+.1f}")
first, last = results[names[0]], results[names[-1]]
print(pad("累计（7 对 0）", 22) + "".join(pad(f"{mib(last['bd'].get(c, 0) - first['bd'].get(c, 0)):+.1f}", 12)
                                        for c in CATS + ["other"]) + f"{mib(last['peak'] - first['peak']):+.1f}")
for a, b in zip(names, names[1:]):
    i = names.index(b)
    for c in CATS + ["other"]:
        publish(f"d{i}_{c}", mib(results[b]["bd"].get(c, 0) - results[a]["bd"].get(c, 0)), fmt="{:+.1f}")
for c in CATS + ["other"]:
    publish(f"dtotal_{c}", mib(first["bd"].get(c, 0) - last["bd"].get(c, 0)), fmt="{:.1f}")

# %% [markdown]
# 逐级的差值要这样读：它是“峰值时刻”的组成之差，而峰值时刻本身会移动。例如加梯度累积之后，“梯度”一栏从 0 变成约 480 MiB：并不是累积让梯度变大了，而是峰值从“反向刚开始、还没有梯度”的时刻，移到了“前几个微批次的梯度已经常驻”的时刻。所以评分器按类别报告“省了多少”时，比较的是你的峰值时刻与起始代码的峰值时刻，看到某一类变成负的“节省”不要意外。
#
# 到这里，一个 8 GiB 的训练步放进了 2 GiB。回到[第 30 章正文](ch30.md)，看这些技术为什么按这个顺序加、各自付出了什么代价，以及上线之前还要检查哪些事。
