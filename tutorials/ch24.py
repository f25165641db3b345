# %% [markdown]
# # 第 24 章 动手实践：LoRA 与 QLoRA 到底省下了哪块显存
#
# 这份教程配合[第 24 章 LoRA 微调显存优化](ch24.md)，用 peft、bitsandbytes 和 `vramlab` 回答六个问题：
#
# 1. LoRA 的前向 $h = W_0x + \frac{\alpha}{r}BAx$ 在 peft 里长什么样？为什么刚套上 LoRA 时模型输出一点不变？
# 2. 秩 $r$ 和 `target_modules` 决定了多少可训练参数？换算到 7B 模型是多少？
# 3. 在一个小 Llama 上，全量微调和各种 LoRA 配置的峰值显存分别由哪几块组成？
# 4. A/B 这条旁路自己要存哪些激活值？`lora_dropout` 和 BF16 基座会让它变多吗？
# 5. H200 参考表里的两行 LoRA，模拟设备能否复现？
# 6. 把冻结的基座换成 8 位 / 4 位（NF4、双重量化）之后，哪一块变小了？QLoRA 的标准写法（`BitsAndBytesConfig` + `prepare_model_for_kbit_training`）在 CPU 上能跑到哪一步？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。小模型用真实张量，GPT-2 small 在 FakeTensorMode 下运行（只有形状、没有数据）。

# %%
import copy
import datetime
import importlib.metadata
import logging
import tempfile
import warnings

import torch
import transformers

import vramlab
from vramlab.display import banner, mib, pad, use_cjk_font
from vramlab.estimate import PHASE_ZH, estimate, linear_shapes
from vramlab.models import build_model, count_params, get_preset
from vramlab.reference import reference_rows
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.workload import Workload, from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的加载提示
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # CPU 上缺可选的 `kernels` 包时的提示，与本章无关
ON_GPU = banner()
for lib in ("transformers", "peft", "bitsandbytes"):
    print(f"{lib:13s}", importlib.metadata.version(lib))
    publish(lib, importlib.metadata.version(lib))
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

import bitsandbytes as bnb                     # noqa: E402  （导入较慢，放在版本信息之后）
import bitsandbytes.functional as bnbF         # noqa: E402
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402

# %% [markdown]
# ## 1. LoRA 的前向：$W_0 x + \frac{\alpha}{r} B A x$，$B$ 从 0 开始
#
# 先在 CPU 上看清楚 peft 做了什么（这一节只看数值，不量显存）。`llama-tiny` 是 `vramlab.models` 里的 2 层 Llama（隐藏维度 128，4 个查询头、2 个键值头，SwiGLU 的中间维度 344，词表 1024），权重随机初始化。我们给每层注意力的 `q_proj` 和 `v_proj` 套上 $r = 8$、$\alpha = 16$ 的 LoRA。

# %%
torch.manual_seed(0)
base = build_model("llama-tiny")
base.eval()
ids = torch.randint(0, get_preset("llama-tiny").vocab, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    ref_logits = base(input_ids=ids).logits

cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
lora = get_peft_model(copy.deepcopy(base), cfg)   # get_peft_model 会原地改模型，这里先复制一份
lora.eval()
q = lora.base_model.model.model.layers[0].self_attn.q_proj
print("q_proj 现在是", type(q).__module__ + "." + type(q).__name__)
print("  冻结的 W0：", tuple(q.base_layer.weight.shape), "requires_grad =", q.base_layer.weight.requires_grad)
print("  A（lora_A）：", tuple(q.lora_A["default"].weight.shape), "，B（lora_B）：", tuple(q.lora_B["default"].weight.shape))
print("  缩放系数 alpha/r =", q.scaling["default"], "；B 是否全为 0：", bool((q.lora_B["default"].weight == 0).all()))
with torch.no_grad():
    print("  套上 LoRA 后 logits 与原模型的最大差：", (lora(input_ids=ids).logits - ref_logits).abs().max().item())
    publish("lora_init_diff", (lora(input_ids=ids).logits - ref_logits).abs().max().item())
lora.print_trainable_parameters()

# %% [markdown]
# 可训练参数正好是“每个被适配的矩阵 $r \times (d_{\text{in}} + d_{\text{out}})$”之和：`q_proj` 是 $128 \to 128$，`v_proj` 因为只有 2 个键值头，是 $128 \to 64$；两层共 $2 \times 8 \times [(128+128) + (128+64)] = 7168$。
#
# 下面把 $B$ 随便改成非零，手算 $W_0x + \frac{\alpha}{r}B(Ax)$，和 peft 的输出对比；再用 `merge_and_unload()` 把 $\frac{\alpha}{r}BA$ 加进 $W_0$，看合并后的普通模型输出是否一致（这就是 LoRA “推理时没有额外延迟”的来历）。

# %%
with torch.no_grad():
    for mod in lora.modules():
        if hasattr(mod, "lora_B"):
            mod.lora_B["default"].weight.normal_(std=0.02)
    x = torch.randn(3, 128)
    A, B, W0 = q.lora_A["default"].weight, q.lora_B["default"].weight, q.base_layer.weight
    by_hand = x @ W0.T + q.scaling["default"] * (x @ A.T) @ B.T
    print("手算与 peft 的最大差：", (by_hand - q(x)).abs().max().item())
    adapted_logits = lora(input_ids=ids).logits
    merged = lora.merge_and_unload()
    print("合并前后 logits 的最大差：", (merged(input_ids=ids).logits - adapted_logits).abs().max().item(),
          "；合并后参数量：", f"{sum(p.numel() for p in merged.parameters()):,}",
          "（原模型", f"{sum(p.numel() for p in base.parameters()):,}）")

# %% [markdown]
# ## 2. 秩与目标模块：可训练参数有多少
#
# 每个被适配的 $d_{\text{in}} \times d_{\text{out}}$ 矩阵多出 $r(d_{\text{in}} + d_{\text{out}})$ 个参数。下面对 $r \in \{4, 8, 16, 64\}$、两种目标模块（只套 `q_proj`、`v_proj`，或 `"all-linear"`：注意力的 4 个投影加 MLP 的 3 个投影，不含输出层）逐一计算：`llama-tiny` 用 peft 实际数一遍并与公式核对；`llama-7b`（Llama-2-7B 的形状：32 层，隐藏维度 4096，MLP 中间维度 11008）用同一公式（形状来自 `vramlab.estimate.linear_shapes`）。

# %%
TARGETS = {"q,v": ["q_proj", "v_proj"], "all-linear": "all-linear"}
NAMES = {"q,v": ("q", "v"), "all-linear": ("q", "k", "v", "o", "gate", "up", "down")}


def lora_count(model_name, r, targets):
    p = get_preset(model_name)
    shapes = linear_shapes(p)
    return p.n_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in NAMES[targets])


N_TINY, N_7B = count_params("llama-tiny"), count_params("llama-7b")
print(f"llama-tiny 共 {N_TINY:,} 个参数；llama-7b 共 {N_7B:,} 个参数\n")
publish("n_7b", f"{N_7B:,}")
checked = 0
print(pad("r", 4), pad("目标模块", 12), pad("tiny：peft 实数", 16), pad("tiny：公式", 12), pad("7B：可训练参数", 16),
      pad("占 7B 的比例", 12), "7B 适配器（FP32 权重+梯度+AdamW，16 字节/参数）")
for r in (4, 8, 16, 64):
    for tname, targets in TARGETS.items():
        pm = get_peft_model(build_model("llama-tiny"), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))
        counted = sum(p.numel() for p in pm.parameters() if p.requires_grad)
        formula = lora_count("llama-tiny", r, tname)
        assert counted == formula
        n7 = lora_count("llama-7b", r, tname)
        print(pad(str(r), 4), pad(tname, 12), pad(f"{counted:,}", 16), pad(f"{formula:,}", 12), pad(f"{n7:,}", 16),
              pad(f"{n7 / N_7B:.4%}", 12), f"{n7 * 16 / 2**20:,.0f} MiB")
        key = f"lora7_{r}_{'qv' if tname == 'q,v' else 'all'}"
        publish(f"{key}_n", f"{n7:,}")
        publish(f"{key}_share", n7 / N_7B, fmt="{:.4%}")
        publish(f"{key}_mib", f"{n7 * 16 / 2**20:,.0f}")
        checked += 1
publish("lora_checked", checked)
publish("lora7_16_all_share2", lora_count("llama-7b", 16, "all-linear") / N_7B, fmt="{:.2%}")
publish("lora7_64_all_share1", lora_count("llama-7b", 64, "all-linear") / N_7B, fmt="{:.1%}")
publish("lora7_64_all_gib", lora_count("llama-7b", 64, "all-linear") * 16 / 2**30, fmt="{:.1f}")
publish("base_bf16_gb", N_7B * 2 / 1e9, fmt="{:.1f}")
publish("base_bf16_gib", N_7B * 2 / 2**30, fmt="{:.1f}")

# %% [markdown]
# 再把 7B 的“模型状态”（参数、梯度、优化器状态，不含激活值）按三种做法算一遍（纯算术）：
#
# - 全量微调，混合精度 + Adam：每个参数 16 字节（ZeRO 论文的算法：16 位参数 2、16 位梯度 2、FP32 主权重 4、$m$ 4、$v$ 4）；
# - LoRA：冻结的基座存成 BF16（2 字节/参数），没有梯度、没有优化器状态；适配器按 peft 的默认升成 FP32，每个可训练参数 4 + 4 + 8 = 16 字节；
# - QLoRA：注意力和 MLP 的线性层权重存成 NF4 + 双重量化（$0.5 + \frac{1}{64} + \frac{4}{64 \times 256}$ 字节/参数），词嵌入、输出层和 RMSNorm 仍是 BF16。

# %%
p7 = get_preset("llama-7b")
linear_7b = p7.n_layers * sum(i * o for i, o, _ in linear_shapes(p7).values())
nf4_bytes = 0.5 + 1 / 64 + 4 / (64 * 256)
r16 = lora_count("llama-7b", 16, "all-linear")
rows = [("全量微调（混合精度 + Adam）", N_7B * 16),
        ("LoRA r=16 all-linear，BF16 基座", N_7B * 2 + r16 * 16),
        ("QLoRA r=16 all-linear，NF4 基座", linear_7b * nf4_bytes + (N_7B - linear_7b) * 2 + r16 * 16)]
print(f"7B 里线性层权重 {linear_7b:,} 个（{linear_7b / N_7B:.1%}），其余（词嵌入、输出层、RMSNorm）{N_7B - linear_7b:,} 个\n")
print(pad("做法", 34), pad("模型状态 GB（十进制）", 22), "GiB")
for (label, nbytes), key in zip(rows, ("full", "lora", "qlora")):
    print(pad(label, 34), pad(f"{nbytes / 1e9:.1f}", 22), f"{nbytes / 2**30:.1f}")
    publish(f"state_{key}_gb", nbytes / 1e9, fmt="{:.1f}")
    publish(f"state_{key}_gib", nbytes / 2**30, fmt="{:.1f}")

# %% [markdown]
# ## 3. 显存账：全量微调 vs LoRA（`llama-tiny`，真实张量）
#
# 下面在设备上建模型，用 AdamW（只交给 `requires_grad=True` 的参数）训练 2 步：第 1 步热身（AdamW 在第一次 `step()` 时才创建状态），第 2 步之前 `reset_peak()`，读第 2 步的峰值和峰值时刻的分类 `dev.breakdown()`。批大小 4、序列长度 64。配置：全量微调；只套 `q,v` 时 $r \in \{4, 8, 16, 64\}$；`all-linear` 时 $r \in \{8, 64\}$（其余秩的可训练参数见上一节，为了让教程跑得快，这里不逐一测）。真卡上只有峰值，没有分类（表中记为“—”）。
#
# 注意：模拟设备和真卡一样，第一次矩阵乘时会分配 cuBLAS 工作区（前向、反向各一个，H200 上各 32 MiB，共 64 MiB，类别 `cuda_overhead`）。`llama-tiny` 的一切加起来只有十几 MiB，这 64 MiB 会淹没所有差别，所以下表单独列出它，“峰值−cuBLAS”一栏才是要比较的数。
#
# `prepare(model, ...)` 的签名和本章评分练习的 `prepare_model(model)` 一样：拿到一个全部参数可训练的模型，返回要训练的模型。

# %%
BATCH, SEQ = 4, 64
CATS = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")


def prepare(model, r=None, targets=None, **lora_kwargs):
    """r=None：全量微调（原样返回）；否则套上 LoRA（peft 会冻结所有基座参数）。"""
    if r is None:
        return model
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, **lora_kwargs))


def measure(label, make_model, steps=2):
    with vramlab.open_device("auto") as dev:
        model = make_model(dev)
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        g = torch.Generator().manual_seed(1)
        batch = torch.randint(0, get_preset("llama-tiny").vocab, (BATCH, SEQ), generator=g).to(dev.torch_device)
        losses = []
        for i in range(steps):
            if i == 1:
                dev.reset_peak()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        bd = dev.breakdown()
        return dict(label=label, peak=dev.max_allocated(), bd=bd, losses=losses,
                    trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                    where=dev.snapshot()["peak_where"].split(" @ ")[0])


def tiny_on(dev, dtype=None):
    return build_model("llama-tiny", device=dev.torch_device, dtype=dtype)


runs = [measure("全量微调", lambda dev: prepare(tiny_on(dev)))]
for tname, ranks in (("q,v", (4, 8, 16, 64)), ("all-linear", (8, 64))):
    for r in ranks:
        runs.append(measure(f"LoRA r={r} {tname}", lambda dev, r=r, t=TARGETS[tname]: prepare(tiny_on(dev), r, t)))


def show(rows, base=None):
    print(pad("配置", 30), pad("可训练参数", 12),
          *(pad(c, 11) for c in ("参数", "梯度", "优化器状态", "激活值", "临时张量")),
          pad("cuBLAS", 8), pad("峰值−cuBLAS", 12), "峰值时刻")
    for x in rows:
        ws = x["bd"].get("cuda_overhead", 0)
        cells = [f"{mib(x['bd'].get(c, 0)):.2f}" if x["bd"] else "—" for c in CATS]   # 真卡上没有分类
        print(pad(x["label"], 30), pad(f"{x['trainable']:,}", 12), *(pad(v, 11) for v in cells),
              pad(f"{mib(ws):.0f}", 8), pad(f"{mib(x['peak'] - ws):.2f}", 12), x["where"] or "—")


print(f"llama-tiny，批大小 {BATCH}，序列长度 {SEQ}，AdamW；第 2 步的已分配峰值，单位 MiB\n")
show(runs)
print("\n第 1 步的损失（LoRA 的 B 从 0 开始，所以与全量微调相同）：",
      sorted({round(x["losses"][0], 6) for x in runs}))
first = sorted({round(x["losses"][0], 6) for x in runs})
publish("first_losses", "、".join(f"{v:.6f}" for v in first))
publish("first_losses_n", len(first))


def publish_run(x, key):
    """一行表格的数：可训练参数、各类别、峰值（含与不含 cuBLAS 工作区）。"""
    ws = x["bd"].get("cuda_overhead", 0)
    publish(f"{key}_trainable", f"{x['trainable']:,}")
    for c, short in (("parameters", "param"), ("optimizer_state", "opt"), ("activations", "act"), ("temporaries", "temp")):
        publish(f"{key}_{short}_mib", mib(x["bd"].get(c, 0)), fmt="{:.2f}")
    publish(f"{key}_peak_mib", mib(x["peak"]), fmt="{:.2f}")
    publish(f"{key}_net_mib", mib(x["peak"] - ws), fmt="{:.2f}")
    publish(f"{key}_loss1", x["losses"][0], fmt="{:.4f}")


KEYS3 = ["full", "qv4", "qv8", "qv16", "qv64", "all8", "all64"]
for x, key in zip(runs, KEYS3):
    publish_run(x, key)
net = {key: round(mib(x["peak"] - x["bd"].get("cuda_overhead", 0)), 2) for x, key in zip(runs, KEYS3)}
act = {key: round(mib(x["bd"].get("activations", 0)), 2) for x, key in zip(runs, KEYS3)}
ws = runs[0]["bd"].get("cuda_overhead", 0)
publish("ws_mib", mib(ws), fmt="{:.0f}")
publish("ws_each_mib", mib(ws) / 2, fmt="{:.0f}")                          # 前向、反向各一个
publish("sum_gap_max_mib", max(abs(net[k] - sum(round(mib(x["bd"].get(c, 0)), 2) for c in CATS))
                               for x, k in zip(runs, KEYS3)), fmt="{:.2f}")
publish("qv_rank_growth_mib", net["qv64"] - net["qv4"], fmt="{:.2f}")
publish("act_full_minus_qv8_mib", act["full"] - act["qv8"], fmt="{:.2f}")
publish("full_vs_qv8_pct", 1 - runs[2]["peak"] / runs[0]["peak"], fmt="{:.0%}")

# %% [markdown]
# 怎么读这张表：
#
# - **优化器状态**按可训练参数线性变化：全量微调是 $8N$ 字节（AdamW 的 $m$、$v$），LoRA 只剩适配器的那一点。
# - **梯度**一栏要看峰值时刻。在这个配置下，所有行的峰值都在反向一开始（对 log-softmax 求梯度，`_log_softmax_backward_data`），那时一个梯度都还没产生，所以全是 0。如果峰值落在反向末尾或 `optimizer.step()`（批次更小、开了激活检查点时），全量微调的全部梯度都会算进峰值，LoRA 只有适配器大小的梯度。
# - **参数**几乎不变：LoRA 不删基座，冻结的权重一字节不少，还多了适配器。
# - **激活值**不是按 $r$ 缩放的：冻结的线性层不需要算权重梯度，就不必为此保存输入，所以只套 `q,v` 时激活值比全量微调少；`all-linear` 给每个线性层都接上了 A，每个 A 都要为自己的梯度保存输入 $x$，激活值又涨回来。$r$ 从 4 到 64 只改变 $A$ 的输出（$b \times s \times r$）这一小块。
#
# 把峰值时刻的分类画成堆叠柱状图（不含 cuBLAS 工作区）：

# %%
import matplotlib.pyplot as plt  # noqa: E402

ZH = use_cjk_font()
colors = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer_state": "#C44E52",
          "activations": "#55A868", "temporaries": "#8172B3"}
zh_names = {"parameters": "参数", "gradients": "梯度", "optimizer_state": "优化器状态",
            "activations": "激活值", "temporaries": "临时张量"}
fig, ax = plt.subplots(figsize=(10, 4))
labels = [x["label"].replace("全量微调", "全量微调" if ZH else "full FT").replace(" ", "\n", 1) for x in runs]
bottom = [0.0] * len(runs)
for c in CATS if runs[0]["bd"] else ():        # 真卡上没有分类：只画峰值
    vals = [mib(x["bd"].get(c, 0)) for x in runs]
    ax.bar(range(len(runs)), vals, bottom=bottom, color=colors[c], label=zh_names[c] if ZH else c)
    bottom = [b + v for b, v in zip(bottom, vals)]
if not runs[0]["bd"]:
    ax.bar(range(len(runs)), [mib(x["peak"]) for x in runs], color="#4C72B0", label="峰值" if ZH else "peak")
ax.set_xticks(range(len(runs)), labels, fontsize=8)
ax.set_ylabel("峰值时刻已分配显存 (MiB)" if ZH else "allocated at peak (MiB)")
ax.set_title("llama-tiny，批大小 4，序列长度 64：峰值的组成（不含 64 MiB cuBLAS 工作区）" if ZH
             else "llama-tiny, batch 4, seq 64: peak breakdown (64 MiB cuBLAS workspace excluded)")
ax.legend(fontsize=8, ncol=5)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 4. A/B 旁路自己的激活值：`lora_dropout` 与 BF16 基座
#
# 对每个被适配的线性层，LoRA 旁路的计算是 $\text{dropout}(x) \to A \to B$，autograd 要为它保存：
#
# - $A$ 的输入（为了算 $\partial L / \partial A$）：没有 dropout 时就是 $x$ 本身（与别处保存的同一个张量共享存储时不另占显存）；有 dropout 时是一份新的 $b \times s \times d_{\text{in}}$ 张量，外加 dropout 的掩码；
# - $B$ 的输入 $Ax$：$b \times s \times r$，很小。
#
# 还有一个不显眼的来源：基座是 BF16 时，peft 默认把适配器升成 FP32（`get_peft_model(..., autocast_adapter_dtype=True)`，为了训练稳定），前向时把 $x$ 转成 FP32 再进 $A$，于是每个适配层多存一份 FP32 的 $x$。下面在 `all-linear`、$r = 8$ 上比较这几种情况。

# %%
def bf16_lora(dev, autocast):
    model = tiny_on(dev, dtype=torch.bfloat16)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    return get_peft_model(model, cfg, autocast_adapter_dtype=autocast)


extra = [next(x for x in runs if x["label"] == "LoRA r=8 all-linear"),
         measure("LoRA r=8 all-linear dropout=0.1",
                 lambda dev: prepare(tiny_on(dev), 8, "all-linear", lora_dropout=0.1)),
         measure("BF16 基座 全量微调", lambda dev: prepare(tiny_on(dev, torch.bfloat16))),
         measure("BF16 基座 LoRA（适配器升 FP32）", lambda dev: bf16_lora(dev, True)),
         measure("BF16 基座 LoRA（适配器 BF16）", lambda dev: bf16_lora(dev, False))]
show(extra)
for x, key in zip(extra[1:], ("dropout", "bf16_full", "bf16_lora32", "bf16_lora16")):
    publish_run(x, key)
p = get_preset("llama-tiny")
per_layer_in = sum(i for t, (i, o, _) in linear_shapes(p).items())
print(f"\n参照：每层 7 个线性层的输入维度之和 = {per_layer_in}；"
      f"全部 {p.n_layers} 层的 x 各存一份 FP32：{BATCH} × {SEQ} × {per_layer_in} × {p.n_layers} × 4 字节 = "
      f"{mib(BATCH * SEQ * per_layer_in * p.n_layers * 4):.2f} MiB（算术）")

# %% [markdown]
# `lora_dropout=0.1` 让激活值明显变多：每个适配层多出一份 dropout 后的输入和掩码。BF16 基座时，“适配器升 FP32”比“适配器 BF16”多出的激活值，量级正是上面算的“每个适配层的输入各存一份 FP32”（其中一部分本来就要以 BF16 存）。这些都是 $r$ 管不到的显存：它们跟着批大小 × 序列长度 × 被适配层的输入维度走。
#
# ## 5. 复现 H200 参考表里的 LoRA 行（GPT-2 small，FakeTensorMode）
#
# 参考表（`vramlab/data/h200_gpt2_peaks.md`，NVIDIA H200，PyTorch 2.11.0+cu130，peft 0.21.0，2026-11-29 实测）里有两行 LoRA：peft $r = 8$、$\alpha = 16$，只套 GPT-2 的 `c_attn`（合并的 QKV 投影），AdamW，批大小 8，序列长度 512；一行 FP32 基座，一行 BF16 基座。下面用 `measure_workload` 在 FakeTensorMode 下重跑它们和全量微调的基线。

# %%
ref = {r.name: r for r in reference_rows()}
print(pad("配置", 34), pad("H200 MiB", 10), pad("模拟 MiB", 10), pad("偏差", 9), pad("可训练参数", 13),
      *(pad(c, 9) for c in ("参数", "优化器", "激活值", "临时")), "峰值时刻")
H5 = dict(zip(("small_fp32_adamw_b8_s512", "small_fp32_lora_b8_s512", "small_bf16weights_lora_b8_s512"),
              ("full", "lora", "lorabf16")))
h5 = {}
for name in H5:
    m = measure_workload(from_reference_name(name), backend="cuda" if ON_GPU else "sim", fake=not ON_GPU)
    h = ref[name].steady_mib
    bd = m.breakdown
    print(pad(name, 34), pad(str(h), 10), pad(f"{mib(m.peak_bytes):.1f}", 10),
          pad(f"{(mib(m.peak_bytes) - h) / h:+.2%}", 9), pad(f"{m.trainable_params:,}", 13),
          *(pad(f"{mib(bd.get(c, 0)):.1f}", 9) for c in ("parameters", "optimizer_state", "activations", "temporaries")),
          m.peak_where.split(" @ ")[0])
    key = f"h5_{H5[name]}"
    h5[H5[name]] = (h, m)
    publish(f"{key}_h200", h)
    publish(f"{key}_sim", mib(m.peak_bytes), fmt="{:.1f}")
    publish(f"{key}_trainable", f"{m.trainable_params:,}")
    for c, short in (("parameters", "param"), ("optimizer_state", "opt"), ("activations", "act"), ("temporaries", "temp")):
        publish(f"{key}_{short}", mib(bd.get(c, 0)), fmt="{:.1f}")
publish("h5_act_saved_mib", mib(h5["full"][1].breakdown["activations"] - h5["lora"][1].breakdown["activations"]), fmt="{:.0f}")
publish("h5_lora_cut", 1 - h5["lora"][0] / h5["full"][0], fmt="{:.0%}")
publish("h5_lorabf16_cut", 1 - h5["lorabf16"][0] / h5["full"][0], fmt="{:.0%}")

# %% [markdown]
# 在这个配置下（批大小 8，序列长度 512），激活值和 logits 是峰值的大头：LoRA 把优化器状态从近 1 GiB 降到几 MiB，激活值也因为冻结层不存输入而少了一截，但两者合起来只让峰值从 7925 MiB 降到 6219 MiB（H200）。把冻结的基座换成 BF16，参数和激活值都减半，峰值到 4397 MiB。“临时”一栏（反向开始时 log-softmax 的几份 $[b, s, V]$ 梯度）三行完全一样：LoRA 对 logits 无能为力。
#
# ## 6. 冻结的基座用 8 位 / 4 位
#
# ### 6.1 NF4 与双重量化：一块权重实际占几位
#
# QLoRA 的 NF4 是 16 个码值的非均匀码表，码值取在标准正态分布的分位点上（两端各保留一个 $\pm 1$，0 精确可表示）；每 64 个权重一块，各用自己的 absmax 归一化。bitsandbytes 的 `quantize_4bit` 在 CPU 上可以直接运行。下面量化一块 $1024 \times 1024$、服从正态分布的权重，比较 NF4 与 FP4，以及双重量化（`compress_statistics=True`：把每块的 FP32 absmax 再按 256 个一组量化成 8 位）前后每个参数实际占的位数。

# %% tags=["nf4code"]
code = bnbF.get_4bit_type("nf4", device="cpu")
print("NF4 的 16 个码值：", " ".join(f"{v:+.4f}" for v in code.tolist()))

torch.manual_seed(0)
w = torch.randn(1024, 1024) * 0.02


def state_bytes(qs):
    n = qs.absmax.numel() * qs.absmax.element_size()
    if qs.nested:
        n += qs.state2.absmax.numel() * qs.state2.absmax.element_size() + qs.state2.code.numel() * 4
    return n


print(f"\n{pad('格式', 24)}{pad('权重字节', 12)}{pad('量化常数字节', 14)}{pad('位/参数', 10)}平均相对误差")
for qt in ("nf4", "fp4"):
    for nested in (False, True):
        packed, qs = bnbF.quantize_4bit(w, blocksize=64, quant_type=qt, compress_statistics=nested)
        err = ((bnbF.dequantize_4bit(packed, qs) - w).abs().mean() / w.abs().mean()).item()
        nbytes = packed.numel() * packed.element_size()
        sb = state_bytes(qs)
        print(pad(f"{qt.upper()}{' + 双重量化' if nested else ''}", 24), pad(f"{nbytes:,}", 12), pad(f"{sb:,}", 14),
              pad(f"{(nbytes + sb) * 8 / w.numel():.3f}", 10), f"{err:.4f}")
        key = f"q_{qt}{'dq' if nested else ''}"
        publish(f"{key}_bytes", f"{nbytes:,}")
        publish(f"{key}_const", f"{sb:,}")
        publish(f"{key}_bits", (nbytes + sb) * 8 / w.numel(), fmt="{:.3f}")
        publish(f"{key}_err", err, fmt="{:.4f}")
print(f"对照：FP32 {w.numel() * 4:,} 字节（32 位/参数），BF16 {w.numel() * 2:,} 字节（16 位/参数）")

# %% [markdown]
# 4 位权重本身是 4.000 位/参数；每 64 个权重一个 FP32 absmax 再加 $32/64 = 0.5$ 位；双重量化把它压到 $8/64 + 32/(64 \times 256) \approx 0.127$ 位（表里还多了一张 256 项的 FP32 码表，这块权重小，所以它显得多一点）。同样 4 位，NF4 的误差比 FP4 小：正态分布的权重大多挤在 0 附近，NF4 把码值放在那里。
#
# ### 6.2 QLoRA 式的基座：把线性层换成 `Linear4bit` / `Linear8bitLt`
#
# `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...))` 做的事情，本质上是把模型里的 `nn.Linear` 换成 bitsandbytes 的 `Linear4bit`，权重在搬到设备上时被量化。这里在设备上手工做同样的替换（注意力和 MLP 的 7 个投影；词嵌入、输出层、RMSNorm 保持 FP32），再套 `all-linear`、$r = 8$ 的 LoRA 训练 2 步。8 位版本用 `Linear8bitLt`（LLM.int8() 的层）。计算精度用 FP32（CPU 上最稳妥；GPU 上通常用 BF16）。

# %%
def quantize_base(model, kind):
    """把每层的 7 个线性层换成 bitsandbytes 的量化层（冻结），其余参数不变。"""
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                if kind == "nf4":
                    new = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, quant_type="nf4",
                                            compress_statistics=True, compute_dtype=torch.float32)
                    new.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4",
                                                   compress_statistics=True)
                else:
                    new = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=False, has_fp16_weights=False)
                    new.weight = bnb.nn.Int8Params(lin.weight.data, requires_grad=False, has_fp16_weights=False)
                setattr(parent, name, new.to(lin.weight.device))   # 搬到设备上的这一刻完成量化
                del lin
    return model


qruns = [extra[0]]
for kind, label in (("int8", "INT8 基座（Linear8bitLt）+ LoRA"), ("nf4", "NF4 基座（Linear4bit）+ LoRA")):
    qruns.append(measure(label, lambda dev, k=kind: prepare(quantize_base(tiny_on(dev), k), 8, "all-linear")))
show(qruns)
for x, key in zip(qruns, ("qb_fp32", "qb_int8", "qb_nf4")):
    publish_run(x, key)
print("\n第 1、2 步损失：", {x["label"]: [round(v, 4) for v in x["losses"]] for x in qruns})
w4 = next(m for m in quantize_base(build_model("llama-tiny"), "nf4").modules() if isinstance(m, bnb.nn.Linear4bit))
print("Linear4bit 的权重：", type(w4.weight).__name__, w4.weight.dtype, tuple(w4.weight.shape),
      "；quant_state：absmax", w4.weight.quant_state.absmax.dtype, tuple(w4.weight.quant_state.absmax.shape),
      "，nested =", w4.weight.quant_state.nested)

# %% [markdown]
# 参数一栏变小了：7 个线性层的权重从 FP32 变成 1 字节（INT8）或约半字节（NF4），剩下的主要是 FP32 的词嵌入和输出层（各 $1024 \times 128 \times 4$ 字节 = 0.5 MiB）和 FP32 的适配器。NF4 的量化常数（双重量化后的 absmax、二级 absmax 和码表）不是参数，模拟设备把它们记在 `other` 里（表中未列出）。NF4 基座的损失与 FP32 基座略有不同，因为基座被量化了：QLoRA 训练的是“在量化后的基座上”的适配器。NF4 这一行的激活值和临时张量与 FP32 基座完全相同：量化只动了冻结的权重。
#
# INT8 这一行的激活值和峰值时刻与另外两行不同：本机的 bitsandbytes 走 INT8 层的 CPU 实现，前向里多留了几份 FP32 的中间结果，峰值挪到了前向末尾。GPU 上的 CUDA 内核不同，这一栏不要外推到真卡上；本节要看的是参数一栏。
#
# 反量化发生在每次矩阵乘之前：`Linear4bit` 的前向先把这一层的 NF4 权重还原成计算精度的 $d_{\text{out}} \times d_{\text{in}}$ 临时张量，再做普通的矩阵乘；反向为了求 $\partial L / \partial x$ 再还原一次。这个临时张量一次只有一层那么大，所以它不改变“基座只占约 1/4”的结论，但它让 QLoRA 每步多了反量化的计算。
#
# ### 6.3 标准写法：`BitsAndBytesConfig` + `prepare_model_for_kbit_training`
#
# 实际项目里没人手工换层，而是从检查点加载时让 transformers 量化。下面把 `llama-tiny` 存进临时目录，按 QLoRA 的标准写法加载、准备、套 LoRA，跑一步训练。这一段不在模拟设备上，只验证 API 在本机（CPU）上能跑通，并看 `get_memory_footprint()`（参数和 buffer 的字节数）。

# %%
with tempfile.TemporaryDirectory() as tmp:
    build_model("llama-tiny").save_pretrained(tmp)
    fp32_model = transformers.AutoModelForCausalLM.from_pretrained(tmp)
    bnb_config = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",            # 默认是 "fp4"，QLoRA 用 NF4
        bnb_4bit_use_double_quant=True,       # 默认 False
        bnb_4bit_compute_dtype=torch.bfloat16 if ON_GPU else torch.float32,
    )
    qmodel = transformers.AutoModelForCausalLM.from_pretrained(
        tmp, quantization_config=bnb_config, device_map={"": 0} if ON_GPU else "cpu")
    print("q_proj 的类型：", type(qmodel.model.layers[0].self_attn.q_proj).__name__,
          "；is_loaded_in_4bit =", qmodel.is_loaded_in_4bit)
    print(f"get_memory_footprint()：FP32 {fp32_model.get_memory_footprint():,} 字节，"
          f"4 位加载 {qmodel.get_memory_footprint():,} 字节")
    publish("footprint_fp32", f"{fp32_model.get_memory_footprint():,}")
    publish("footprint_4bit", f"{qmodel.get_memory_footprint():,}")
    qmodel = prepare_model_for_kbit_training(             # 冻结、非量化参数升 FP32、开梯度检查点
        qmodel, gradient_checkpointing_kwargs={"use_reentrant": False})
    print("prepare_model_for_kbit_training 之后：梯度检查点 =", qmodel.is_gradient_checkpointing,
          "；词嵌入 dtype =", qmodel.model.embed_tokens.weight.dtype)
    qmodel = get_peft_model(qmodel, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    qmodel.print_trainable_parameters()
    n_train, n_all = qmodel.get_nb_trainable_parameters()
    publish("qmodel_trainable", f"{n_train:,}")
    publish("qmodel_share", n_train / n_all, fmt="{:.4%}")
    qmodel.train()
    batch = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(1)).to(qmodel.device)
    loss = qmodel(input_ids=batch, labels=batch).loss
    loss.backward()
    print("一步前向 + 反向：loss =", round(loss.item(), 4), "；lora_A 有梯度：",
          next(p for n, p in qmodel.named_parameters() if "lora_A" in n).grad is not None)

# %% [markdown]
# 分页优化器（paged optimizer）呢？它把优化器状态放在 CUDA 统一内存里，显存紧张时由驱动换页到主存。这需要 CUDA：在 CPU 上 bitsandbytes 会给出警告，退回普通（不分页）的实现。

# %%
param = torch.nn.Parameter(torch.randn(4096))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    paged = bnb.optim.PagedAdamW8bit([param], lr=1e-3)
    param.grad = torch.randn(4096)
    paged.step()
print("PagedAdamW8bit 的警告：", [str(c.message) for c in caught if "aged" in str(c.message)] or "无（在 GPU 上）")
print("状态：", {k: (str(v.dtype), tuple(v.shape)) for k, v in paged.state[param].items() if torch.is_tensor(v)})

# %% [markdown]
# ## 7. 回到 7B：估算器怎么说
#
# 最后用 `vramlab.estimate`（解析估算，不运行模型）看 Llama-2-7B 形状、批大小 1、序列长度 1024 的一步训练。它把上面测到的规律写成了公式：LoRA 的基座没有梯度和状态、冻结层不存权重梯度所需的输入、适配层的输入要存、QLoRA 的线性层权重按 NF4 + 双重量化计（`estimate(w, qlora=True)`，LoRA 目标是 `q,v`，peft 对 Llama 的默认）。本章正文里的显存计算器用的就是这套公式。

# %%
KEYS7 = ("parameters", "gradients", "optimizer_state", "activations", "logits_and_loss", "temporaries")
cases = [("全量微调，混合精度（BF16 autocast）", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16-mixed"), False),
         ("全量微调，纯 BF16", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16"), False),
         ("LoRA r=16 q,v，BF16 基座", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16", lora_rank=16), False),
         ("LoRA r=16 q,v，BF16 基座 + 检查点", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16", lora_rank=16,
                                              checkpointing="full"), False),
         ("QLoRA r=16 q,v", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16", lora_rank=16), True),
         ("QLoRA r=16 q,v + 检查点", Workload(model="llama-7b", batch=1, seq=1024, precision="bf16", lora_rank=16,
                                      checkpointing="full"), True)]
EST_KEYS = dict(zip((c[0] for c in cases), ("mixed", "bf16", "lora", "lora_ckpt", "qlora", "qlora_ckpt")))
PHASES = {**PHASE_ZH, "optimizer_step": "`optimizer.step()`"}      # 估算器给出的峰值时刻，中文名
print(pad("配置（llama-7b，批大小 1，序列长度 1024）", 42), pad("估算峰值 GiB", 14),
      *(pad(c, 9) for c in ("参数", "梯度", "优化器", "激活值", "logits", "临时")), "峰值时刻")
for label, wl, ql in cases:
    e = estimate(wl, qlora=ql)
    bd = e.breakdown
    print(pad(label, 42), pad(f"{e.total_bytes / 2**30:.1f}", 14),
          *(pad(f"{bd[c] / 2**30:.2f}", 9) for c in KEYS7), e.peak_phase)
    key = EST_KEYS[label]
    publish(f"est_{key}_gib", e.total_bytes / 2**30, fmt="{:.1f}")
    for c, short in zip(KEYS7, ("param", "grad", "opt", "act", "logits", "temp")):
        publish(f"est_{key}_{short}", bd[c] / 2**30, fmt="{:.2f}")
    publish(f"est_{key}_phase", PHASES.get(e.peak_phase, e.peak_phase))

# %% [markdown]
# 小结：LoRA 砍掉的是与可训练参数成正比的那几块（梯度、优化器状态，以及冻结层为权重梯度保存的输入）；基座本身要靠量化（BF16 → INT8 → NF4）来压；剩下的激活值要靠激活检查点（[第 7 章](ch07.md)）。QLoRA 的标准写法把这三件事放在了一起：4 位基座、LoRA、`prepare_model_for_kbit_training` 默认打开的梯度检查点。
