# %% [markdown]
# # 第 25 章 动手实践：AdaLoRA 与 DoRA 的显存和收敛
#
# 这份教程配合[第 25 章 AdaLoRA 与 DoRA](ch25.md)，用 peft 的真实实现回答四个问题：
#
# 1. LoRA、DoRA、AdaLoRA 分别往模型里加了哪些参数？加完之后模型的输出变了没有？
# 2. 在同一个训练步里，全量微调、LoRA、DoRA、AdaLoRA 的峰值显存各由什么组成？DoRA 多出来的激活值从哪里来？
# 3. DoRA 每次前向都要算一遍 $\|W + \Delta W\|$，这一步临时要多少显存？
# 4. 在同样的步数、同样的随机种子下，三种方法在一个小任务上谁的损失降得快？
#
# 显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 2、3 节在模拟设备上用 FakeTensorMode 运行（只有形状、没有数据）；第 1、4 节用真实张量在 CPU 上计算，只看数值和损失，不看显存。

# %%
import copy
import datetime
import logging
import warnings

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # 在 import peft 之前：本机 CPU 上缺少可选 4 bit 内核的提示，与本章无关
import peft
import torch
import torch.nn.functional as F
import transformers
from peft import AdaLoraConfig, LoraConfig, get_peft_model

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, get_preset
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
warnings.filterwarnings("ignore")              # peft 对小模型配置的几条提示与本章无关
ON_GPU = banner(f"transformers {transformers.__version__}，peft {peft.__version__}")
FAKE = not ON_GPU          # 第 2、3 节：模拟设备上用 FakeTensorMode
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)
publish("peft", peft.__version__)
KEY = {"全量微调": "full", "LoRA": "lora", "DoRA": "dora", "AdaLoRA": "ada"}
torch.set_num_threads(1)   # 第 1、4 节的矩阵都很小，多线程只会在多人共用的 CPU 上互相等待

# %% [markdown]
# ## 1. 三种适配器各加了什么
#
# 基座是 `llama-tiny`：2 层 Llama（隐藏维度 128，4 个查询头、2 个 KV 头，SwiGLU 中间维度 344，词表 1024）。三种方法都适配注意力和 MLP 的全部 7 种线性层：
#
# - **LoRA**：`LoraConfig(r=8, lora_alpha=16)`，每个线性层旁边加 $B A$，$A$ 是 $r \times d_\text{in}$，$B$ 是 $d_\text{out} \times r$，$B$ 初始化为 0。
# - **DoRA**：同一个 `LoraConfig`，只多一个 `use_dora=True`。peft 额外加一个长度为 $d_\text{out}$ 的幅度向量 `lora_magnitude_vector`，初始值是原权重每一行的范数。
# - **AdaLoRA**：`AdaLoraConfig(init_r=12, target_r=8)`。增量写成 SVD 的形式 $P \Lambda Q$，peft 里对应 `lora_B`（$P$）、`lora_E`（$\Lambda$ 的对角线）和 `lora_A`（$Q$）。初始秩 12，训练中按重要性剪到平均 8；$\Lambda$ 初始化为 0。
#
# 三种方法的初始化都让模型输出**不变**：下面把包装前后的 logits 相减来验证。

# %%
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METHODS = ["全量微调", "LoRA", "DoRA", "AdaLoRA"]
EN = {"全量微调": "full FT", "LoRA": "LoRA", "DoRA": "DoRA", "AdaLoRA": "AdaLoRA"}


def wrap(method, model, total_step=40):
    """按方法名把模型包装成要训练的模型；全量微调原样返回。"""
    if method == "全量微调":
        return model
    if method == "LoRA":
        cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    elif method == "DoRA":
        cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM",
                         use_dora=True)
    else:   # AdaLoRA：前 5 步预热，最后 15 步固定秩，中间每 5 步按重要性重新分配一次
        cfg = AdaLoraConfig(init_r=12, target_r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS,
                            task_type="CAUSAL_LM", tinit=5, tfinal=15, deltaT=5, total_step=total_step)
    return get_peft_model(model, cfg)


def trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


ids = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(0))
base = build_model("llama-tiny", seed=0)
with torch.no_grad():
    ref_logits = base(input_ids=ids).logits
n_base = sum(p.numel() for p in base.parameters())
print(f"llama-tiny：{n_base:,} 个参数\n")
publish("n_base", f"{n_base:,}")
print(pad("方法", 10), pad("可训练参数", 12), pad("占基座", 8), pad("与原模型 logits 的最大差", 26),
      "layers.0.self_attn.q_proj 里新增的参数")
for method in METHODS[1:]:
    model = wrap(method, build_model("llama-tiny", seed=0))
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - ref_logits).abs().max().item()
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    new = [f"{n.split('.')[0]} {tuple(p.shape)}" for n, p in q.named_parameters() if "base_layer" not in n]
    print(pad(method, 10), pad(f"{trainable(model):,}", 12), pad(f"{trainable(model) / n_base:.2%}", 8),
          pad(f"{diff:.2e}", 26), "，".join(new))
    publish(f"{KEY[method]}_share", trainable(model) / n_base, fmt="{:.2%}")
    publish(f"{KEY[method]}_init_diff", f"{diff:.2e}")

# %% [markdown]
# 顺带验证一件容易踩空的事：AdaLoRA 的正交正则项是在 peft 的 `AdaLoraModel.forward` 里加进 `loss` 的，而只有设置了 `task_type`（如 `"CAUSAL_LM"`，得到 `PeftModelForCausalLM`）时，外层的 `PeftModel` 才会经过它；不写 `task_type` 时，peft 0.21 的 `PeftModel.forward` 直接调用底下的 transformers 模型，正则项**静默地**消失。下面在同一批数据上对比两种写法的 `loss` 与纯交叉熵之差。

# %%
for task_type in ("CAUSAL_LM", None):
    cfg = AdaLoraConfig(init_r=12, target_r=8, lora_alpha=16, target_modules=TARGETS, total_step=40,
                        task_type=task_type)
    m = get_peft_model(build_model("llama-tiny", seed=0), cfg)
    with torch.no_grad():
        total = m(input_ids=ids, labels=ids).loss.item()
        ce_only = m.base_model.model(input_ids=ids, labels=ids).loss.item()
    print(f"task_type={task_type!s:10s} {type(m).__name__:22s} loss = {total:.4f}，交叉熵 = {ce_only:.4f}，"
          f"正则项 = {total - ce_only:.4f}")
    key = "ada_tt" if task_type else "ada_nott"
    publish(f"{key}_loss", total, fmt="{:.4f}")
    publish(f"{key}_ce", ce_only, fmt="{:.4f}")
    publish(f"{key}_reg", total - ce_only, fmt="{:.4f}")

# %% [markdown]
# 读第一张表：
#
# - LoRA 的 `q_proj`（$128 \to 128$）多了 `lora_A` $8 \times 128$ 和 `lora_B` $128 \times 8$。DoRA 在此之外只多了一个 128 维的 `lora_magnitude_vector`，所以可训练参数只比 LoRA 多了“所有被适配层的输出维度之和”。
# - AdaLoRA 的 `lora_A`、`lora_B` 按**初始秩 12** 分配，再加上 12 个奇异值 `lora_E` 和一个不训练的 `ranknum`（记录初始秩，用来缩放）。训练中被剪掉的秩只是把对应的 $\lambda$ 置 0，矩阵本身不会变小，所以它的可训练参数一直是 LoRA 的约 1.5 倍。
# - 三种方法包装后的输出与原模型相同：LoRA 的 $B = 0$、AdaLoRA 的 $\Lambda = 0$ 让增量恰好为 0；DoRA 的输出是 $m \cdot (W + s\Delta W) / \|W + s\Delta W\|$，初始时 $\Delta W = 0$，而 peft 用同一个函数算出 $m$ 的初值和分母，缩放因子恰好是 1，所以差值也是 0。

# %% [markdown]
# ## 2. 一个训练步的显存：按类别拆开
#
# 现在把四种做法放到模拟设备上，各训练 2 步（第 1 步创建 AdamW 状态，第 2 步是稳态），批大小 8、序列长度 256，FP32。`dev.breakdown()` 给出峰值时刻各类别的字节数。评分器和本章练习用的也是这种比较：AdamW 只管 `requires_grad=True` 的参数。
#
# 注意 `cuda_overhead`（cuBLAS 工作区，前向、反向各 32 MiB）：小模型的峰值里它占了很大一块，而且四种做法都一样，所以表里单独列出“去掉它之后”的峰值。

# %%
B, S = 8, 256
CATS = [("parameters", "参数", "parameters"), ("gradients", "梯度", "gradients"),
        ("optimizer_state", "优化器状态", "optimizer state"), ("activations", "激活值", "activations"),
        ("temporaries", "临时张量", "temporaries"), ("other", "其他", "other")]


def measure(method, steps=2):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = wrap(method, build_model("llama-tiny", seed=0, device=dev.torch_device), total_step=1000)
        data = torch.randint(0, 1024, (B, S), device=dev.torch_device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        for step in range(steps):
            if step == steps - 1:
                dev.reset_peak()
            loss = model(input_ids=data, labels=data).loss
            loss.backward()
            opt.step()
            if method == "AdaLoRA":      # 在 zero_grad 之前：重要性分数要用到 p.grad
                model.base_model.update_and_allocate(step)
            opt.zero_grad(set_to_none=True)
        return dict(method=method, n=trainable(model), peak=dev.max_allocated(), bd=dev.breakdown(),
                    where=dev.snapshot()["peak_where"])


rows = [measure(m) for m in METHODS]
print(pad("方法", 10), pad("可训练参数", 12), pad("峰值 MiB", 10), pad("去掉 cuBLAS MiB", 17),
      *[pad(zh, 12) for _, zh, _ in CATS])
for r in rows:
    net = r["peak"] - r["bd"]["cuda_overhead"]
    print(pad(r["method"], 10), pad(f"{r['n']:,}", 12), pad(f"{mib(r['peak']):.1f}", 10), pad(f"{mib(net):.1f}", 17),
          *[pad(f"{mib(r['bd'][k]):.2f}", 12) for k, _, _ in CATS])
print("\n峰值位置：")
for r in rows:
    print(" ", pad(r["method"], 10), r["where"])
for r in rows:
    key = KEY[r["method"]]
    publish(f"{key}_n", f"{r['n']:,}")
    publish(f"{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"{key}_net_mib", round(mib(r["peak"]), 1) - round(mib(r["bd"]["cuda_overhead"])), fmt="{:.1f}")   # 表里两个取整后的数相减
    for k, _, _ in CATS:
        publish(f"{key}_{k}_mib", mib(r["bd"][k]), fmt="{:.2f}")
ws = rows[0]["bd"]["cuda_overhead"]
publish("ws_mib", mib(ws), fmt="{:.0f}")
publish("ws_each_mib", mib(ws) / 2, fmt="{:.0f}")
act = {KEY[r["method"]]: round(mib(r["bd"]["activations"]), 2) for r in rows}
publish("act_full_minus_lora_mib", act["full"] - act["lora"], fmt="{:.2f}")

# %% [markdown]
# 四种做法的峰值都出现在反向刚开始（对 log-softmax 求梯度）的时刻，这时上一步的梯度已经释放、这一步的梯度还没产生，所以“梯度”一列是 0。逐列看：
#
# - **全量微调**多出来的主要是优化器状态（AdamW 的 $m$、$v$，每个参数 8 字节）；三种参数高效方法的优化器状态都不到 1 MiB。
# - **LoRA** 的激活值反而比全量微调少约 6 MiB：RMSNorm 的权重冻结以后，autograd 不必为权重的梯度保存归一化结果，每个 RMSNorm 少存一份 $B \times S \times h$ 的张量（这里 5 个 RMSNorm，各 1 MiB）；嵌入层冻结以后，第 0 层第一个 RMSNorm 的输入不需要梯度，又少存一份。
# - **DoRA** 的激活值明显高于 LoRA，这是本章的重点，下一个单元格验证它的来源。
# - **AdaLoRA** 的优化器状态按初始秩 12 算，比 LoRA 大一半；“其他”一列是 `RankAllocator` 为每个适配器参数保存的三份重要性统计（`ipt`、`exp_avg_ipt`、`exp_avg_unc`），在 `update_and_allocate` 里创建，不属于参数、梯度或优化器状态。
#
# 下面画成堆叠柱状图（不含 cuBLAS 工作区）。

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
fig, ax = plt.subplots(figsize=(8, 4))
labels = [r["method"] if ZH else EN[r["method"]] for r in rows]
bottom = [0.0] * len(rows)
for key, zh, en in CATS:
    vals = [mib(r["bd"][key]) for r in rows]
    ax.bar(labels, vals, bottom=bottom, label=zh if ZH else en)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax.set_ylabel("峰值时刻的显存 (MiB，不含 cuBLAS 工作区)" if ZH else "memory at the peak (MiB, without cuBLAS workspace)")
ax.set_title("llama-tiny，FP32，批大小 8，序列长度 256" if ZH else "llama-tiny, FP32, batch 8, sequence 256")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### DoRA 的激活值为什么多
#
# peft 里 DoRA 层的前向（`peft/tuners/lora/dora.py` 的 `DoraLinearLayer.forward`，`lora_dropout=0` 时）是：
#
# ```python
# weight_norm = ‖W + s·BA‖（逐行，detach，不参与反向）
# mag_norm_scale = m / weight_norm                     # 形状 [d_out]
# lora_result = lora_B(lora_A(x))                      # [B, S, d_out]
# result_dora = (mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * s
# ```
#
# 幅度 $m$ 要梯度，所以两个逐元素乘法都得为反向保存与 $m$ 相乘的那个大张量：`base_result`（基座线性层的输出 $W x$）和 `lora_result * s`，各是 $B \times S \times d_\text{out}$。LoRA 不需要它们：$W x$ 算完就加进输出，不保存。于是 DoRA 每个被适配的线性层多存约 $2 \cdot B \cdot S \cdot d_\text{out}$ 个数。下面按这个公式算一遍，与测得的激活值之差对比。

# %%
p = get_preset("llama-tiny")
kv = p.kv_heads * p.hidden // p.heads
d_out = {"q_proj": p.hidden, "k_proj": kv, "v_proj": kv, "o_proj": p.hidden,
         "gate_proj": p.ffn_hidden, "up_proj": p.ffn_hidden, "down_proj": p.hidden}
sum_out = p.n_layers * sum(d_out.values())
predicted = 2 * B * S * sum_out * 4
by = {r["method"]: r for r in rows}
measured = by["DoRA"]["bd"]["activations"] - by["LoRA"]["bd"]["activations"]
print("每层各线性层的输出维度：", d_out)
print(f"所有被适配层的输出维度之和 Σd_out = {p.n_layers} 层 × {sum(d_out.values())} = {sum_out}")
print(f"公式 2·B·S·Σd_out·4 字节 = 2 × {B} × {S} × {sum_out} × 4 = {mib(predicted):.2f} MiB")
print(f"测得 DoRA 与 LoRA 的激活值之差       = {mib(measured):.2f} MiB")
publish("dora_predicted_mib", mib(predicted), fmt="{:.2f}")
publish("dora_extra_act_mib", mib(measured), fmt="{:.2f}")
ada_buffers = 3 * by["AdaLoRA"]["n"] * 4
print(f"\nAdaLoRA 的重要性统计：3 × {by['AdaLoRA']['n']:,} 个参数 × 4 字节 = {mib(ada_buffers):.2f} MiB，"
      f"测得“其他” = {mib(by['AdaLoRA']['bd']['other']):.2f} MiB")
publish("ada_buffers_mib", mib(ada_buffers), fmt="{:.2f}")

# %% [markdown]
# ## 3. DoRA 的权重范数：每次前向都要临时物化整个权重
#
# 上面的 `weight_norm` 怎么算？peft 先用 `lora_B(lora_A(I))` 把 $\Delta W = BA$ 乘出来（$I$ 是 $d_\text{in} \times d_\text{in}$ 的单位矩阵，源码注释说直接写 `lora_B.weight @ lora_A.weight` 在 FSDP 下会出错），再算 $W + s \cdot \Delta W$ 每一行的范数。这几个张量都是**权重大小**的，用完就释放，不进激活值，但它们在每一层的前向里都会短暂出现。
#
# 层很小时看不出来；下面在模拟设备上单独放一个 $4096 \times 4096$ 的线性层（Llama-2-7B 注意力投影的形状），只喂 16 个 token。先做一次前向热身（第一次矩阵乘会分配 cuBLAS 工作区），再测第二次前向的峰值比前向开始时多了多少，并列出 DoRA 前向峰值时刻最大的几块分配。

# %%
class OneLinear(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.proj(x)


D = 4096
print(pad("方法", 8), pad("权重 MiB", 10), "前向期间比前向开始时多用的 MiB")
for method in ("LoRA", "DoRA"):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        layer = OneLinear(D).to(dev.torch_device)
        cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["proj"], use_dora=(method == "DoRA"))
        layer = get_peft_model(layer, cfg)
        x = torch.randn(16, D, device=dev.torch_device)
        y = layer(x)                 # 热身：第一次矩阵乘会分配 cuBLAS 工作区，不算进下面的测量
        del y
        before = dev.allocated()
        dev.reset_peak()
        y = layer(x)
        extra = dev.max_allocated() - before
        top = dev.top_allocations(5)
    print(pad(method, 8), pad(f"{mib(D * D * 4):.1f}", 10), f"{mib(extra):.1f}")
    publish(f"one_{method.lower()}_extra_mib", mib(extra), fmt="{:.1f}")
publish("one_weight_mib", mib(D * D * 4), fmt="{:.1f}")
print("\nDoRA 前向峰值时刻最大的几块分配：")
for t in top:
    print(f"  {mib(t['bytes']):7.1f} MiB  {t['category']:12s} {t['op']}")
acts = [t for t in top if t["category"] == "activations"]
publish("one_dora_blocks", len(acts))
publish("one_dora_block_mib", max(mib(t["bytes"]) for t in acts), fmt="{:.1f}")
publish("one_dora_ops", "、".join(f"`{t['op'].split('.')[0]}`" for t in acts))

# %% [markdown]
# LoRA 的前向只多出几个 $16 \times 8$、$16 \times 4096$ 的小张量；DoRA 的前向临时多出四份 $4096 \times 4096$ 的 FP32 矩阵（单位矩阵、$\Delta W$、$s \cdot \Delta W$、$W + s\Delta W$），合计是权重本身的 4 倍。它们逐层出现又逐层释放，所以不一定抬高整个训练步的峰值（第 2 节的峰值在反向开始时）；但在批次小、层很宽的时候（例如 Llama 的 `down_proj` 输入维度是 11008，单位矩阵就有 $11008^2$ 个数），这一段可能变成新的峰值。DoRA 论文为了降低训练开销，建议把 $\|V + \Delta V\|$ 当作常数、不让梯度流过它，peft 照做了（代码里的 `weight_norm.detach()`），这省掉的是反向为范数保存的张量，前向的这几份临时矩阵仍然要算。

# %% [markdown]
# ## 4. 收敛速度：同样的步数、同样的种子
#
# 参数高效微调是在**训练好的**模型上做的，而 `llama-tiny` 是随机初始化的：它的输出层给不出有把握的预测，直接拿来做适配器训练，比较的是“谁先学会放大 logits”，而不是“谁先学会新任务”。所以先造一个小小的“预训练”：
#
# - **任务**：16 个输入符号（token 2–17）各对应一个输出符号（token 18–33），对应关系是一个固定的随机置换。每个样本是 8 对“输入, 输出”交替排列的 16 个 token，只在输出位置计算损失（输入符号是随机的，无从预测）。数据由固定种子的生成器现场生成。
# - **预训练**：全量微调 40 步（AdamW，学习率 3e-3），学会置换 A。
# - **微调**：换成另一个置换 B，分别用 LoRA、DoRA、AdaLoRA 训练 40 步。三者用同一份预训练权重、同样的学习率（1e-2，AdamW，不加权重衰减）、同一个种子生成同样的批次；种子取 0 和 1 各跑一遍。
#
# 记录每一步的交叉熵（AdaLoRA 的 `loss` 里还加了正交正则项，这里另算纯交叉熵来比较），报告：第 1、10、20、40 步的损失，首次降到 1.0 和 0.1 以下的步数。这一节在 CPU 上用真实张量计算，不经过模拟设备。

# %%
K, PAIRS, BATCH = 16, 8, 16
STEPS, LR = 40, 1e-2
perm_gen = torch.Generator().manual_seed(1234)
PERM_A = torch.randperm(K, generator=perm_gen) + 2 + K
PERM_B = torch.randperm(K, generator=perm_gen) + 2 + K


def make_batch(gen, perm):
    x = torch.randint(0, K, (BATCH, PAIRS), generator=gen)
    ids = torch.stack([x + 2, perm[x]], dim=2).reshape(BATCH, 2 * PAIRS)
    labels = ids.clone()
    labels[:, 0::2] = -100                       # 输入符号的位置不算损失
    return ids, labels


def cross_entropy(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)


pretrained = build_model("llama-tiny", seed=0)
opt = torch.optim.AdamW(pretrained.parameters(), lr=3e-3)
gen = torch.Generator().manual_seed(99)
for step in range(40):
    ids, labels = make_batch(gen, PERM_A)
    loss = pretrained(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"预训练 40 步后，置换 A 上的损失：{loss.item():.4f}")
publish("pre_loss_a", loss.item(), fmt="{:.4f}")
with torch.no_grad():
    ids, labels = make_batch(torch.Generator().manual_seed(7), PERM_B)
    print(f"同一个模型在置换 B 上的损失：{cross_entropy(pretrained(input_ids=ids).logits, labels).item():.4f}")
    publish("pre_loss_b", cross_entropy(pretrained(input_ids=ids).logits, labels).item(), fmt="{:.4f}")

# %%
def finetune(method, seed):
    model = wrap(method, copy.deepcopy(pretrained), total_step=STEPS)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    ce_hist, reg_first = [], None
    for step in range(STEPS):
        ids, labels = make_batch(gen, PERM_B)
        out = model(input_ids=ids, labels=labels)
        ce = cross_entropy(out.logits, labels)
        if reg_first is None:
            reg_first = out.loss.item() - ce.item()  # AdaLoRA：损失里的正交正则项；其他方法为 0
        out.loss.backward()
        opt.step()
        if method == "AdaLoRA":
            model.base_model.update_and_allocate(step)
        opt.zero_grad(set_to_none=True)
        ce_hist.append(ce.item())
    return model, ce_hist, reg_first


def first_below(hist, th):
    return next((str(i + 1) for i, v in enumerate(hist) if v <= th), f">{STEPS}")


curves, ada_model = {}, None
print(pad("方法", 10), pad("种子", 6), pad("第1步", 8), pad("第10步", 8), pad("第20步", 8), pad("第40步", 8),
      pad("≤1.0 的步数", 13), pad("≤0.1 的步数", 13), "第1步的正交正则项")
for seed in (0, 1):
    for method in METHODS[1:]:
        model, hist, reg = finetune(method, seed)
        curves[(method, seed)] = hist
        if method == "AdaLoRA" and seed == 0:
            ada_model = model
        print(pad(method, 10), pad(str(seed), 6), *[pad(f"{hist[i - 1]:.3f}", 8) for i in (1, 10, 20, 40)],
              pad(first_below(hist, 1.0), 13), pad(first_below(hist, 0.1), 13), f"{reg:.4f}" if method == "AdaLoRA" else "—")
        key = f"conv_{KEY[method]}_{seed}"
        for i in (1, 10, 20, 40):
            publish(f"{key}_s{i}", hist[i - 1], fmt="{:.3f}")
        publish(f"{key}_le1", first_below(hist, 1.0))
        publish(f"{key}_le01", first_below(hist, 0.1))
        if method == "AdaLoRA":
            publish(f"{key}_reg", reg, fmt="{:.2f}")


def span(values, fmt="{}"):
    """“a–b”，两端相同时只写一个数。"""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def steps(method, th):
    return [int(first_below(curves[(method, sd)], th)) for sd in (0, 1) if first_below(curves[(method, sd)], th).isdigit()]


publish("conv_ld_le1_span", span(steps("LoRA", 1.0) + steps("DoRA", 1.0)))
publish("conv_ld_le01_span", span(steps("LoRA", 0.1) + steps("DoRA", 0.1)))
publish("conv_ada_le1_span", span(steps("AdaLoRA", 1.0)))
publish("conv_ada_s40_span", span([curves[("AdaLoRA", sd)][39] for sd in (0, 1)], "{:.3f}"))
publish("conv_ada_s10_span", span([curves[("AdaLoRA", sd)][9] for sd in (0, 1)], "{:.1f}"))
publish("conv_ld_s10_span", span([curves[(m, sd)][9] for m in ("LoRA", "DoRA") for sd in (0, 1)], "{:.1f}"))

# %%
fig, ax = plt.subplots(figsize=(8, 4))
colors = {"LoRA": "tab:blue", "DoRA": "tab:orange", "AdaLoRA": "tab:green"}
for (method, seed), hist in curves.items():
    ax.plot(range(1, STEPS + 1), hist, color=colors[method], linestyle="-" if seed == 0 else "--",
            label=f"{method} 种子 {seed}" if ZH else f"{method} seed {seed}")
ax.set_yscale("log")
ax.set_xlabel("训练步" if ZH else "step")
ax.set_ylabel("交叉熵（对数坐标）" if ZH else "cross-entropy (log scale)")
ax.set_title("llama-tiny 学置换 B：同样的步数与种子" if ZH else "llama-tiny learning permutation B: same steps and seeds")
ax.legend(fontsize=8, ncol=3)
fig.tight_layout()
plt.show()

# %% [markdown]
# 三点观察（具体数字见上表）：
#
# - **AdaLoRA 起步慢**：它的 $\Lambda$ 初始化为 0，$P$、$Q$ 是标准差 0.02 的小随机数，开始时只有 $\Lambda$ 能拿到梯度，而这个梯度又正比于很小的 $P$、$Q$；正交正则项还要先把 $P^\top P$、$Q Q^\top$ 往单位矩阵拉（第 1 步的正则项就是表里最后一列）。LoRA 和 DoRA 的 $A$ 是正常尺度的随机矩阵，$B$ 一上来就有可观的梯度。
# - **LoRA 与 DoRA** 在这个任务上差不多快，谁先到达某个阈值随种子变化；这与 DoRA 论文在大模型上的结论（同样的秩下精度更高）不是一回事：论文比的是训练完的准确率，而且是预训练好的 LLaMA、LLaVA 等模型。
# - 这只是一个**示意**：2 层、随机初始化再“预训练”40 步的小模型，16 个符号的置换，CPU 上几十步。它说明的是“三种方法在相同预算下怎么比、该记录什么”，不能替代论文里的基准测试，也不能推广到你的任务上。

# %% [markdown]
# ### AdaLoRA 最后把秩分给了谁
#
# 训练结束时，peft 把每个矩阵保留了哪些奇异值记在 `peft_config["default"].rank_pattern` 里（每个矩阵一个布尔列表）。下面统计种子 0 那次训练的结果：初始每个矩阵 12 个，目标是平均 8 个，总预算 $8 \times 14 = 112$。

# %%
pattern = ada_model.peft_config["default"].rank_pattern
ranks = {k.replace("base_model.model.model.", "").replace(".lora_E.default", ""): sum(v) for k, v in pattern.items()}
for name, r in ranks.items():
    print(pad(name, 28), r, "█" * r)
print(f"合计 {sum(ranks.values())} 个奇异值（{len(ranks)} 个矩阵，平均 {sum(ranks.values()) / len(ranks):.2f}）")
sched = ada_model.base_model.rankallocator
print("预算随步数的变化（tinit=5，tfinal=15，total_step=40，三次方递减）：",
      [sched.budget_schedule(t)[0] for t in (0, 5, 10, 15, 20, 25, 30, 40)])
publish("ada_total_rank", sum(ranks.values()))
publish("ada_qk_ranks", span([r for n, r in ranks.items() if n.endswith(("q_proj", "k_proj"))]))
publish("ada_other_ranks", span([r for n, r in ranks.items() if not n.endswith(("q_proj", "k_proj"))]))
for t in (0, 5, 10, 15, 20):
    publish(f"ada_budget_{t}", sched.budget_schedule(t)[0])

# %% [markdown]
# 预算从 $12 \times 14 = 168$ 个奇异值开始，热身 5 步后按三次方曲线降到 112，第 25 步（`total_step - tfinal`）起固定。最后的分配并不均匀：两层的 `q_proj`、`k_proj` 几乎被剪光，`v_proj`、`o_proj` 和 MLP 保留了大部分。这和任务的性质一致：输出符号只取决于同一位置的输入符号，不需要改变“看哪里”（由 Q、K 决定），要改的是“取到什么、怎么变换”（V、O 和 MLP）。换一个任务、换一个种子，分配都会不同；这正是 AdaLoRA 想要的：让数据决定秩花在哪里。还要记住：被剪掉的秩在 peft 里只是把 $\lambda$ 置 0，`lora_A`、`lora_B` 的形状不变，显存和计算量都不会因此下降。
