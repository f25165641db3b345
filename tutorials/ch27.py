# %% [markdown]
# # 第 27 章 动手实践：P-Tuning v1、v2、LoRA 与它们的组合各占多少显存
#
# 这份教程配合[第 27 章 P-Tuning v2](ch27.md)，在 2 层的 `llama-tiny`（RMSNorm、SwiGLU、RoPE，4 个查询头共享 2 个 KV 头）上回答五个问题：
#
# 1. P-Tuning v1（peft 的 `PromptEncoderConfig`）、P-Tuning v2（`PrefixTuningConfig`，带或不带重参数化投影）、LoRA、P-Tuning v2 + LoRA，各有多少可训练参数？分别落在哪些模块里？换成 Llama-2-7B 的形状又是多少？
# 2. 训练一步的峰值显存差在哪一类：参数、优化器状态、激活值还是临时张量？虚拟 token 放在输入层（v1）和放在每层的键值里（v2），激活值随长度怎么涨？
# 3. 跨层共享前缀或重参数化网络，可训练参数和 AdamW 状态能省多少？
# 4. 推理时投影去哪了？BF16 的基座配 FP32 的前缀是什么情况？前缀在键值缓存里占多少？为什么 peft 的前缀调优不能开梯度检查点，怎样手写一个能开的？
# 5. 前缀和 LoRA 怎样装在同一个模型上？保存时要注意什么？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。本教程全部用真实张量。

# %%
import datetime
import logging
import os
import tempfile
import warnings

import torch
import transformers
from transformers import DynamicCache

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # peft 导入 bitsandbytes 时的 CPU 内核提示与本章无关
import peft
from peft import (LoraConfig, PeftModel, PrefixTuningConfig, PromptEncoderConfig, get_peft_model,
                  inject_adapter_in_model)

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}，peft {peft.__version__}")
CUBLAS = 64 * 2**20 if not ON_GPU else 0       # 模拟设备里两个 cuBLAS 工作区共 64 MiB，比较时扣掉
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)
publish("peft", peft.__version__)
KEYS = {"全量微调": "full", "P-Tuning v1（MLP）": "v1mlp", "P-Tuning v1（LSTM）": "v1lstm", "P-Tuning v2": "v2",
        "v2 + 投影（默认）": "proj", "v2 + 投影（512）": "proj512", "LoRA r=8": "lora", "v2 + LoRA": "v2lora"}

# %% [markdown]
# ## 1. 可训练参数：谁多谁少，落在哪里
#
# 先定义要比较的几种做法。它们都从同一个随机初始化的 `llama-tiny` 出发（$L = 2$ 层，隐藏维度 $d = 128$，KV 维度 $d_{kv} = 2 \times 32 = 64$），虚拟 token 数 $P = 16$：
#
# - **P-Tuning v1**：`PromptEncoderConfig`，16 个虚拟 token 的嵌入先过一个提示编码器（默认是 3 层 MLP；另测一次 LSTM），输出拼在**输入层**的词嵌入前面；
# - **P-Tuning v2**：`PrefixTuningConfig`，每一层注意力的键和值前面各拼 16 个可训练向量，不加投影（peft 和 P-Tuning v2 官方代码的默认）；
# - **P-Tuning v2 + 投影**：`prefix_projection=True`，16 个 token 的嵌入经过一个两层 MLP 生成所有层的键值，`encoder_hidden_size` 取 peft 的默认（等于 $d_{kv}$）和 P-Tuning v2 官方仓库的默认 512；
# - **LoRA**：`r=8`，加在 `q_proj`、`v_proj` 上；
# - **P-Tuning v2 + LoRA**：先用 `inject_adapter_in_model` 把 LoRA 注入基座，再用 `get_peft_model` 包上前缀（peft 把基座参数全部冻结，所以要把 LoRA 的参数重新设为可训练）。

# %%
P = 16


def v1_mlp(m):
    return get_peft_model(m, PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=P))


def v1_lstm(m):
    return get_peft_model(m, PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=P,
                                                 encoder_reparameterization_type="LSTM"))


def v2(m, p=P):
    return get_peft_model(m, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=p))


def v2_proj(m, hidden=None):
    return get_peft_model(m, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=P, prefix_projection=True,
                                                encoder_hidden_size=hidden))


def lora(m):
    return get_peft_model(m, LoraConfig(task_type="CAUSAL_LM", r=8, target_modules=["q_proj", "v_proj"]))


def v2_lora(m):
    m = inject_adapter_in_model(LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), m)
    with warnings.catch_warnings():        # “第二次用 PEFT 修改模型”的提醒：这里正是有意为之
        warnings.simplefilter("ignore", UserWarning)
        pm = get_peft_model(m, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=P))
    for name, p in pm.named_parameters():       # get_peft_model 冻结了基座里的一切，包括刚注入的 LoRA
        if "lora_" in name:
            p.requires_grad_(True)
    return pm


METHODS = [
    ("全量微调", lambda m: m),
    ("P-Tuning v1（MLP）", v1_mlp),
    ("P-Tuning v1（LSTM）", v1_lstm),
    ("P-Tuning v2", v2),
    ("v2 + 投影（默认）", v2_proj),
    ("v2 + 投影（512）", lambda m: v2_proj(m, 512)),
    ("LoRA r=8", lora),
    ("v2 + LoRA", v2_lora),
]


def where(name):
    """把一个可训练参数归到一类。"""
    if "lora_" in name:
        return "LoRA"
    if "prompt_encoder" in name:
        if name.endswith("embedding.weight"):
            return "嵌入"
        return "LSTM" if "lstm" in name else "MLP"
    return "基座"


def trainable_breakdown(model):
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[where(name)] = out.get(where(name), 0) + p.numel()
    return out


def count_on_meta(preset, make):
    """在 meta 设备上建模型、套上 peft：不占内存，只数参数。"""
    with torch.device("meta"):
        model = make(build_model(preset))
    total = sum(p.numel() for p in model.parameters())
    return trainable_breakdown(model), total


print(pad("做法", 22), pad("llama-tiny 可训练", 18), pad("占全部", 9), pad("构成", 40), "Llama-2-7B 形状可训练")
for label, make in METHODS:
    bd, total = count_on_meta("llama-tiny", make)
    bd7, total7 = count_on_meta("llama-7b", make)
    n, n7 = sum(bd.values()), sum(bd7.values())
    parts = "；".join(f"{k} {v:,}" for k, v in bd.items()) if label != "全量微调" else "全部参数"
    print(pad(label, 22), pad(f"{n:,}", 18), pad(f"{100 * n / total:.2f}%", 9), pad(parts, 40),
          f"{n7:,}（{100 * n7 / total7:.3f}%）")
    key = KEYS[label]
    publish(f"cnt_{key}_tiny", f"{n:,}")
    publish(f"cnt_{key}_7b", f"{n7:,}")
    names = {"嵌入": "前缀表"} if not ({"MLP", "LSTM"} & set(bd)) else {}     # 没有投影时，“嵌入”就是前缀表本身
    publish(f"cnt_{key}_parts", "，".join(f"{names.get(k, k)} {v:,}" for k, v in bd.items()) if label != "全量微调" else "全部")

# %% [markdown]
# 几点值得注意（逐条对照上表）：
#
# - P-Tuning v2 不加投影时，可训练的只有一张 $P \times (L \cdot 2 \cdot d_{kv})$ 的表：$16 \times (2 \times 2 \times 64) = 4096$。Llama-2-7B 的形状是 $16 \times (32 \times 2 \times 4096) = 4{,}194{,}304$，恰好和 `q_proj`、`v_proj` 上 r=8 的 LoRA 一样多（$32 \times 2 \times 8 \times (4096 + 4096)$，巧合）。
# - 重参数化投影的第二层是 $h \times (L \cdot 2 \cdot d_{kv})$，$h$ 比 $P$ 大多少倍，参数就多多少倍。peft 默认 $h = d_{kv}$，在 Llama-2-7B 上就是 4096，可训练参数一下子超过 10 亿，比不加投影多两百多倍。
# - P-Tuning v1 的可训练参数几乎全在提示编码器里；LSTM 版本在 `llama-tiny` 上甚至比整个基座还大。
# - 这里的“占全部”是占**套上 peft 之后**全部参数的比例，分母包含新加的参数。

# %% [markdown]
# ## 2. 训练一步：峰值差在哪一类
#
# 每种做法训练 2 步（批大小 2，序列长度 64，AdamW，只把 `requires_grad=True` 的参数交给优化器），第 1 步热身（AdamW 在第一次 `step()` 时才创建状态），读第 2 步的稳态峰值和峰值时刻的分类。模拟设备在峰值时刻把显存分成参数、梯度、优化器状态、激活值、临时张量几类；反向过程中新生成的梯度在 `optimizer.step()` 之前算作“临时张量”。两个 cuBLAS 工作区（共 64 MiB）对这么小的模型是大头，表里一律扣掉。

# %%
B, S = 2, 64
torch.manual_seed(0)
IDS = torch.randint(0, 1024, (B, S))


def train(make, ids=IDS, steps=2, lr=1e-3, device="auto"):
    with vramlab.open_device(device) as dev:
        model = make(build_model("llama-tiny", device=dev.torch_device))
        batch = ids.to(dev.torch_device)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr)
        losses = []
        for step in range(steps):
            if step == 1:
                dev.reset_peak()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0)
        return dict(peak=dev.max_allocated() - CUBLAS, bd=dev.breakdown(), losses=losses, state=state,
                    n=sum(p.numel() for p in params))


rows = {}
for label, make in METHODS:
    rows[label] = train(make)

full = rows["全量微调"]["peak"]
print(pad("做法", 22), pad("可训练", 10), pad("AdamW 状态 KiB", 15), pad("峰值 MiB", 10), pad("与全量之比", 11),
      pad("参数", 7), pad("激活值", 8), pad("临时", 7), "损失 第1→第2步")
for label, r in rows.items():
    bd = r["bd"]
    print(pad(label, 22), pad(f"{r['n']:,}", 10), pad(f"{r['state'] / 1024:.1f}", 15), pad(f"{mib(r['peak']):.2f}", 10),
          pad(f"{r['peak'] / full:.2f}", 11), pad(f"{mib(bd['parameters']):.2f}", 7),
          pad(f"{mib(bd['activations']):.2f}", 8), pad(f"{mib(bd['temporaries']):.2f}", 7),
          f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}")
for label, r in rows.items():
    key = KEYS[label]
    publish(f"{key}_n", f"{r['n']:,}")
    publish(f"{key}_state_kib", r["state"] / 1024, fmt="{:.1f}")
    publish(f"{key}_net_mib", mib(r["peak"]), fmt="{:.2f}")
    publish(f"{key}_ratio", r["peak"] / full, fmt="{:.2f}")
    publish(f"{key}_act_mib", mib(r["bd"]["activations"]), fmt="{:.2f}")
ws = rows["全量微调"]["bd"].get("cuda_overhead", CUBLAS)
assert ws == CUBLAS, "扣掉的常数要等于测得的 cuBLAS 工作区"
publish("ws_mib", mib(ws), fmt="{:.0f}")
publish("full_peak_mib", round(mib(full), 2) + round(mib(ws)), fmt="{:.2f}")
v1 = rows["P-Tuning v1（MLP）"]["peak"]
publish("v1mlp_ratio_with_ws", (round(mib(v1), 2) + round(mib(ws))) / (round(mib(full), 2) + round(mib(ws))), fmt="{:.2f}")
shares = [mib(ws) / (mib(r["peak"]) + mib(ws)) for r in rows.values()]
publish("ws_share_span", f"{min(shares):.0%}–{max(shares):.0%}")
combo = rows["v2 + LoRA"]["peak"] - max(rows["P-Tuning v2"]["peak"], rows["LoRA r=8"]["peak"])
publish("combo_extra_mib", mib(combo), fmt="{:.2f}")

# %% [markdown]
# 读这张表：
#
# - **优化器状态**跟可训练参数成正比：AdamW 每个 FP32 参数 8 字节。全量微调的状态约 4.8 MiB，P-Tuning v2 只有 32 KiB；加投影（512）就涨到 1.3 MiB 左右。LSTM 版的 P-Tuning v1 在这个小模型上可训练参数比基座还多，峰值反而比全量微调高。
# - **激活值**：全量微调要为每个线性层保存输入，好算权重的梯度；基座冻结后，冻结线性层的输入就不必保存了，这是所有 PEFT 做法激活值都比全量微调少的原因。但梯度仍然要一路传回第一层（v1 的提示在输入层，v2 的前缀在每一层），所以整条反向链还在，激活值不会降到零。
# - P-Tuning v1 的激活值比 v2 大：它的 16 个虚拟 token 是真正的输入 token，在每一层都有隐藏状态，都要过 FFN；peft 还会在 logits 前面多出 16 个位置。v2 的前缀只出现在注意力的键和值里。下一节把长度拉长，差别更明显。
# - 损失都在下降（随机数据、学习率 $10^{-3}$、只有 2 步，这里只说明“在训练”，不比较效果）。
#
# 把峰值时刻的组成画成堆叠柱状图（扣掉了 64 MiB 的 cuBLAS 工作区，柱顶是峰值；真卡上没有分类，只画峰值）：

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
CATS = [("parameters", "参数", "parameters"), ("gradients", "梯度", "gradients"),
        ("optimizer_state", "优化器状态", "optimizer state"), ("activations", "激活值", "activations"),
        ("temporaries", "临时张量", "temporaries"), ("other", "其他", "other")]
EN = {"全量微调": "full FT", "P-Tuning v1（MLP）": "v1 (MLP)", "P-Tuning v1（LSTM）": "v1 (LSTM)",
      "P-Tuning v2": "v2", "v2 + 投影（默认）": "v2 + proj\n(default)", "v2 + 投影（512）": "v2 + proj\n(512)",
      "LoRA r=8": "LoRA r=8", "v2 + LoRA": "v2 + LoRA"}
runs = list(rows.values())
x = range(len(runs))
fig, ax = plt.subplots(figsize=(10, 4))
if runs[0]["bd"]:
    bottom = [0.0] * len(runs)
    for key, zh, en in CATS:
        vals = [mib(r["bd"].get(key, 0)) for r in runs]
        if any(vals):        # 一项都没有的类别不进图例
            ax.bar(x, vals, bottom=bottom, label=zh if ZH else en)
            bottom = [b + v for b, v in zip(bottom, vals)]
else:
    ax.bar(x, [mib(r["peak"]) for r in runs], label="峰值" if ZH else "peak")
for i, r in enumerate(runs):
    ax.text(i, mib(r["peak"]) + 0.2, f"{mib(r['peak']):.2f}", ha="center", fontsize=8)
ax.set_xticks(list(x), [k.replace("（", "\n（") if ZH else EN[k] for k in rows], fontsize=8)
ax.set_ylabel("峰值时刻的已分配显存 (MiB)" if ZH else "allocated at the peak (MiB)")
ax.set_title("llama-tiny，批大小 2，序列长度 64，AdamW：峰值的组成（不含 cuBLAS 工作区）" if ZH
             else "llama-tiny, batch 2, seq 64, AdamW: memory at the peak (cuBLAS workspace excluded)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### 虚拟 token 放在哪一层，激活值怎么涨
#
# 把虚拟 token 数从 16 逐步加到 128（序列长度仍是 64），比较 P-Tuning v1 和 v2 的激活值（峰值时刻的“激活值”一类）和峰值。$P = 16$ 的一行直接取上一张表。

# %%
print(pad("P", 6), pad("v1 激活值 MiB", 15), pad("v1 峰值 MiB", 13), pad("v2 激活值 MiB", 15), pad("v2 峰值 MiB", 13),
      "v2 可训练")
PS = (16, 32, 64, 128)
sweep = {}
for p in PS:
    if p == P:
        r1, r2 = rows["P-Tuning v1（MLP）"], rows["P-Tuning v2"]
    else:
        r1 = train(lambda m: get_peft_model(m, PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=p)))
        r2 = train(lambda m: v2(m, p))
    sweep[p] = (r1, r2)
    print(pad(str(p), 6), pad(f"{mib(r1['bd']['activations']):.2f}", 15), pad(f"{mib(r1['peak']):.2f}", 13),
          pad(f"{mib(r2['bd']['activations']):.2f}", 15), pad(f"{mib(r2['peak']):.2f}", 13), f"{r2['n']:,}")
    publish(f"sw{p}_v1_act", mib(r1["bd"]["activations"]), fmt="{:.2f}")
    publish(f"sw{p}_v1_net", mib(r1["peak"]), fmt="{:.2f}")
    publish(f"sw{p}_v2_act", mib(r2["bd"]["activations"]), fmt="{:.2f}")
    publish(f"sw{p}_v2_net", mib(r2["peak"]), fmt="{:.2f}")
    publish(f"sw{p}_v2_n", f"{r2['n']:,}")
publish("sw_v1_growth", sweep[PS[-1]][0]["bd"]["activations"] / sweep[PS[0]][0]["bd"]["activations"], fmt="{:.1f}")
publish("sw_v2_growth", sweep[PS[-1]][1]["bd"]["activations"] / sweep[PS[0]][1]["bd"]["activations"] - 1, fmt="{:.0%}")

# %% [markdown]
# v1 每多一个虚拟 token，每层就多一整个 token 的激活值（注意力、FFN、归一化都算一遍，logits 也多一行）；v2 每多一个虚拟 token，每层只多 $2 d_{kv}$ 个数的键值，外加注意力分数矩阵多一列。序列长度是 64 时，$P = 128$ 的 v1 相当于把序列长度变成三倍。画出来：

# %%
def reading(r, what):
    if what == "peak":
        return mib(r["peak"])
    return mib(r["bd"]["activations"]) if r["bd"] else float("nan")     # 真卡上没有分类


fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for ax, (what, zh, en) in zip(axes, [("act", "峰值时刻的激活值 (MiB)", "activations at the peak (MiB)"),
                                     ("peak", "稳态峰值 (MiB，不含 cuBLAS 工作区)", "steady peak (MiB, no cuBLAS workspace)")]):
    for i, (name, style) in enumerate([("P-Tuning v1（MLP）", "o-"), ("P-Tuning v2", "s--")]):
        ax.plot(PS, [reading(sweep[p][i], what) for p in PS], style,
                label=name if ZH else name.replace("（MLP）", " (MLP)"))
    ax.set_xticks(PS)
    ax.set_xlabel("虚拟 token 数 P（序列长度 64）" if ZH else "virtual tokens P (sequence length 64)")
    ax.set_ylabel(zh if ZH else en)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle("llama-tiny，批大小 2：虚拟 token 放在输入层（v1）还是每层的键值里（v2）" if ZH
             else "llama-tiny, batch 2: virtual tokens at the input (v1) or in every layer's keys/values (v2)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. 跨层参数共享
#
# P-Tuning v2 默认每层各有一份前缀。要让可训练参数和优化器状态更少，可以让各层共享一部分参数。下面比较三种做法（都保持“每层的键值前面有 16 个向量”这一结构；第 2 种取 $h = 4$ 和 $h = 512$ 两档）：
#
# 1. **不共享**：peft 默认，$P \cdot L \cdot 2 d_{kv}$；
# 2. **共享重参数化网络**：peft 的 `prefix_projection=True`，嵌入表和 MLP 的第一层对所有层共用，第二层的输出按层切开；$h$ 小于 $P$ 时它是一个跨层共享的低秩基，$h$ 大于 $P$ 时反而更多；
# 3. **完全共享**：手写，所有层用同一份前缀，$P \cdot 2 d_{kv}$，是不共享的 $1/L$。
#
# 手写的版本不用 peft，而是直接构造一个 `DynamicCache` 当作 `past_key_values` 传给模型（peft 内部也正是这么做的）。先检查手写的“不共享”版本和 peft 的 `PrefixTuningConfig` 完全一致：把 peft 的前缀表拷过来，比较损失和梯度。

# %%
class PrefixKV(DynamicCache):
    """只读的前缀键值缓存：update() 返回“前缀 + 本批”的拼接，但不改写自己。
    同一层再算一遍（激活检查点的重算）得到的结果完全相同。"""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


class DeepPrefix(torch.nn.Module):
    """手写的 P-Tuning v2：每层注意力的键、值前面各拼 P 个可训练向量。
    share="none"：每层一份（与 peft 相同的布局）；share="all"：所有层共用一份。"""

    def __init__(self, config, num_virtual_tokens, share="none"):
        super().__init__()
        self.L, self.nkv = config.num_hidden_layers, config.num_key_value_heads
        self.dh = config.hidden_size // config.num_attention_heads
        self.P, self.share = num_virtual_tokens, share
        layers = self.L if share == "none" else 1
        self.table = torch.nn.Parameter(torch.randn(self.P, layers * 2 * self.nkv * self.dh) * 0.02)

    def forward(self, batch_size):
        t = self.table.view(self.P, -1, 2, self.nkv, self.dh).expand(self.P, self.L, 2, self.nkv, self.dh)
        kv = t.permute(1, 2, 3, 0, 4)                       # [层, K/V, KV 头, P, 头维度]
        return PrefixKV([(kv[i, 0].expand(batch_size, -1, -1, -1), kv[i, 1].expand(batch_size, -1, -1, -1))
                         for i in range(self.L)])


class PrefixModel(torch.nn.Module):
    """冻结的基座 + 手写前缀，接口与 peft 模型相同：model(input_ids=..., labels=...)。"""

    def __init__(self, base, num_virtual_tokens, share="none"):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.prefix = DeepPrefix(base.config, num_virtual_tokens, share)

    def forward(self, input_ids, labels=None):
        return self.base(input_ids=input_ids, labels=labels, past_key_values=self.prefix(input_ids.shape[0]))


ids = IDS[:2, :64]
ref = v2(build_model("llama-tiny"))
loss_ref = ref(input_ids=ids, labels=ids).loss
loss_ref.backward()
hand = PrefixModel(build_model("llama-tiny"), P)
with torch.no_grad():
    hand.prefix.table.copy_(ref.prompt_encoder.default.embedding.weight)
loss_hand = hand(input_ids=ids, labels=ids).loss
loss_hand.backward()
print(f"peft 损失 {loss_ref.item():.6f}，手写损失 {loss_hand.item():.6f}，"
      f"前缀梯度最大差 {(hand.prefix.table.grad - ref.prompt_encoder.default.embedding.weight.grad).abs().max().item():.1e}")
publish("hand_loss_peft", loss_ref.item(), fmt="{:.6f}")
publish("hand_loss_hand", loss_hand.item(), fmt="{:.6f}")
publish("hand_grad_diff", f"{(hand.prefix.table.grad - ref.prompt_encoder.default.embedding.weight.grad).abs().max().item():.1e}")

# %% [markdown]
# 一致。下面在同样的批次上训练这四种配置，读可训练参数、AdamW 状态（从 `optimizer.state` 里逐个张量加起来）和峰值；最后一列是把同样的做法放到 Llama-2-7B 的形状上（$L = 32$，$d_{kv} = 4096$）算出的可训练参数。

# %%
SHARING = [
    ("不共享（peft 默认）", "P-Tuning v2", lambda L, dkv, h: P * L * 2 * dkv),
    ("共享 MLP，h=4", lambda m: v2_proj(m, 4),
     lambda L, dkv, h: P * dkv + dkv * 4 + 4 + 4 * L * 2 * dkv + L * 2 * dkv),
    ("共享 MLP，h=512", "v2 + 投影（512）",
     lambda L, dkv, h: P * dkv + dkv * 512 + 512 + 512 * L * 2 * dkv + L * 2 * dkv),
    ("所有层共用一份（手写）", lambda m: PrefixModel(m, P, share="all"), lambda L, dkv, h: P * 2 * dkv),
]
print(pad("做法", 24), pad("可训练", 10), pad("AdamW 状态 KiB", 15), pad("峰值 MiB", 10), pad("损失 第1→第2步", 18),
      "Llama-2-7B 形状可训练（算术）")
for label, make, formula in SHARING:
    r = rows[make] if isinstance(make, str) else train(make)      # 前两种第 2 节已经测过
    n7 = formula(32, 4096, None)
    assert r["n"] == formula(2, 64, None)
    print(pad(label, 24), pad(f"{r['n']:,}", 10), pad(f"{r['state'] / 1024:.1f}", 15), pad(f"{mib(r['peak']):.2f}", 10),
          pad(f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}", 18), f"{n7:,}（AdamW 状态 {mib(8 * n7):.1f} MiB）")
    key = {"不共享（peft 默认）": "none", "共享 MLP，h=4": "h4", "共享 MLP，h=512": "h512", "所有层共用一份（手写）": "all"}[label]
    publish(f"share_{key}_n", f"{r['n']:,}")
    publish(f"share_{key}_state_kib", r["state"] / 1024, fmt="{:.1f}")
    publish(f"share_{key}_net_mib", mib(r["peak"]), fmt="{:.2f}")
    publish(f"share_{key}_n7", f"{n7:,}")
    publish(f"share_{key}_state7_mib", mib(8 * n7), fmt="{:.1f}")
    publish(f"share_{key}_state7_gib", 8 * n7 / 2**30, fmt="{:.1f}")

# %% [markdown]
# 共享省的是可训练参数本身，以及跟着它成比例的梯度（每参数 4 字节）和 AdamW 状态（每参数 8 字节）。在 7B 的形状上，不共享的前缀连同它的梯度和 AdamW 状态合计 $4{,}194{,}304 \times 16$ 字节 = 64 MiB，本来就不大；真正要警惕的是反方向：$h = 512$ 的投影在 7B 形状上是 1.37 亿个可训练参数，光 AdamW 状态就超过 1 GiB。激活值几乎不受影响，因为每层的键值前缀长度不变；峰值只在参数变多（$h = 512$）时上升。

# %% [markdown]
# ## 4. 显存优化策略
#
# ### 4.1 推理时没有投影
#
# peft 保存前缀调优的适配器时，不存嵌入表和 MLP，而是先把它们跑一遍，存下**输出**：一张 $P \times (L \cdot 2 d_{kv})$ 的表（`prompt_embeddings`）。加载时 `inference_mode=True`，`PrefixEncoder` 里就只建这一张表，没有 MLP。

# %%
trained = v2_proj(build_model("llama-tiny"), 512)
with torch.no_grad():
    out_train = trained(input_ids=ids).logits
with tempfile.TemporaryDirectory() as d:
    trained.save_pretrained(d)
    size = os.path.getsize(os.path.join(d, "adapter_model.safetensors"))
    loaded = PeftModel.from_pretrained(build_model("llama-tiny"), d)
with torch.no_grad():
    out_loaded = loaded(input_ids=ids).logits
n_train = sum(p.numel() for p in trained.prompt_encoder.parameters())
n_infer = sum(p.numel() for p in loaded.prompt_encoder.parameters())
print(f"训练时提示编码器：{n_train:,} 个参数；{[tuple(p.shape) for p in trained.prompt_encoder.parameters()]}")
print(f"加载后提示编码器：{n_infer:,} 个参数；{[tuple(p.shape) for p in loaded.prompt_encoder.parameters()]}")
print(f"adapter_model.safetensors：{size:,} 字节；两者 logits 的最大差 {(out_train - out_loaded).abs().max().item():.1e}")
publish("save_n_train", f"{n_train:,}")
publish("save_n_infer", f"{n_infer:,}")
publish("save_bytes", f"{size:,}")
publish("save_logits_diff", f"{(out_train - out_loaded).abs().max().item():.1e}")

# %% [markdown]
# ### 4.2 BF16 基座、FP32 前缀
#
# 基座用 BF16 存时，peft 建出的前缀表仍是 FP32（它按默认 dtype 创建），每次前向在 `get_prompt()` 里转成基座的 dtype 再进键值缓存。这正是混合精度的做法：可训练的那一小块保持 FP32，让 AdamW 的小更新不被 BF16 舍入掉（[第 6 章](ch06.md)），键值和注意力按 BF16 算。

# %%
with vramlab.open_device("auto") as dev:
    m16 = v2(build_model("llama-tiny", dtype=torch.bfloat16, device=dev.torch_device))
    table = m16.prompt_encoder.default.embedding.weight
    cache = m16.get_prompt(batch_size=B)
    k0 = cache.layers[0].keys
    print(f"基座权重 {m16.base_model.model.layers[0].self_attn.q_proj.weight.dtype}，前缀表 {table.dtype} {tuple(table.shape)}，"
          f"送进缓存的键 {k0.dtype} {tuple(k0.shape)}")
    cache_bytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    print(f"批大小 {B} 时前缀在键值缓存里占 {cache_bytes:,} 字节 = B·L·2·P·d_kv·2 = "
          f"{B * 2 * 2 * P * 64 * 2:,}（算术）")
    publish("cache_bytes", f"{cache_bytes:,}")
    publish("cache_table_shape", str(tuple(table.shape)))
    publish("cache_key_shape", str(tuple(k0.shape)))

# %% [markdown]
# ### 4.3 键值缓存的视角
#
# 在注意力看来，$P$ 个前缀向量和 $P$ 个已经生成过的 token 没有区别：它们就是键值缓存里排在最前面的 $P$ 个位置。所以前缀在推理时占的显存，和多 $P$ 个 token 的上下文一样：每个样本 $L \cdot 2 \cdot P \cdot d_{kv} \cdot b$ 字节（$b$ 为每个数的字节数）。peft 还会把前缀按批大小复制（`get_prompt()` 里的 `repeat(batch_size, ...)`），每个样本一份。下表按 Llama-2-7B 的形状（$L = 32$，$d_{kv} = 4096$，FP16）算：

# %%
print(pad("P", 6), pad("每个样本 MiB", 14), pad("批大小 32 MiB", 15), "相当于多少个真实 token 的缓存")
for p in (16, 64, 128):
    per = 32 * 2 * p * 4096 * 2
    print(pad(str(p), 6), pad(f"{mib(per):.0f}", 14), pad(f"{mib(per * 32):.0f}", 15), p)
    publish(f"kvp{p}_per_mib", mib(per), fmt="{:.0f}")
    publish(f"kvp{p}_b32_mib", mib(per * 32), fmt="{:.0f}")
    publish(f"kvp{p}_b32_gib", per * 32 / 2**30, fmt="{:.0f}")

# %% [markdown]
# ### 4.4 梯度检查点与前缀
#
# 激活检查点（梯度检查点）在反向时把一层的前向再算一遍。transformers 的 `GradientCheckpointingLayer` 为了防止重算时把缓存再更新一次，默认在检查点层里把 `past_key_values` 换成 `None`；而前缀正是通过 `past_key_values` 送进去的。peft 干脆在套前缀时检查：基座开了梯度检查点就报错。下面依次演示：先开检查点再套 peft；先套 peft 再开检查点。

# %% tags=["ckpt_errors"]
m = build_model("llama-tiny")
m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
try:
    v2(m)
except ValueError as e:
    print("先开检查点再套前缀 →", type(e).__name__ + ":", e)

m = v2(build_model("llama-tiny"))
m.base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
m.train()
try:
    m(input_ids=ids, labels=ids).loss.backward()
except RuntimeError as e:
    print("先套前缀再开检查点 →", type(e).__name__ + ":", str(e).splitlines()[0])

# %% [markdown]
# 第二个错误来自注意力：检查点层把前缀丢掉了，键只剩 64 个位置，而注意力掩码是按“前缀 16 + 输入 64 = 80”建的。
#
# 手写的 `PrefixKV` 不改写自己，重算时得到的键值和第一次完全一样，所以可以告诉检查点层“这个缓存只读，留着它”：把每个解码层的 `_can_checkpoint_with_cache` 设为 `True`（transformers 5.17 的 `GradientCheckpointingLayer` 提供的开关）。下面在批大小 4、序列长度 256 上比较开与不开检查点（一次前向加反向）：

# %%
LONG = torch.randint(0, 1024, (4, 256), generator=torch.Generator().manual_seed(1))


def hand_prefix(ckpt):
    def make(base):
        if ckpt:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for layer in base.model.layers:
                layer._can_checkpoint_with_cache = True
        base.train()
        return PrefixModel(base, P)
    return make


results = {}
for ckpt in (False, True):
    torch.manual_seed(0)                               # 两次的前缀初始化相同
    with vramlab.open_device("auto") as dev:
        model = hand_prefix(ckpt)(build_model("llama-tiny", device=dev.torch_device))
        batch = LONG.to(dev.torch_device)
        dev.reset_peak()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        results[ckpt] = dict(loss=loss.item(), grad=model.prefix.table.grad.clone(), peak=dev.max_allocated() - CUBLAS,
                             bd=dev.breakdown())
for ckpt, r in results.items():
    print(pad("开检查点" if ckpt else "不开检查点", 12), f"损失 {r['loss']:.6f}  峰值 {mib(r['peak']):.2f} MiB  "
          f"激活值 {mib(r['bd']['activations']):.2f} MiB  临时 {mib(r['bd']['temporaries']):.2f} MiB")
print("前缀梯度最大差：", f"{(results[True]['grad'] - results[False]['grad']).abs().max().item():.1e}")
for ckpt, r in results.items():
    key = "ckpt_on" if ckpt else "ckpt_off"
    publish(f"{key}_loss", r["loss"], fmt="{:.6f}")
    publish(f"{key}_net_mib", mib(r["peak"]), fmt="{:.2f}")
    publish(f"{key}_act_mib", mib(r["bd"]["activations"]), fmt="{:.2f}")
    publish(f"{key}_temp_mib", mib(r["bd"]["temporaries"]), fmt="{:.2f}")
publish("ckpt_grad_diff", f"{(results[True]['grad'] - results[False]['grad']).abs().max().item():.1e}")

# %% [markdown]
# 损失和梯度完全相同，峰值时刻的激活值从整层的中间结果降到每层一个输入，代价是反向时多算一遍前向。注意这个开关的前提是缓存只读：对会被写入的普通 `DynamicCache` 打开它，重算时前缀后面会再拼一次键值，结果就错了。
#
# ## 5. 前缀 + LoRA
#
# 第 2 节的表里已经有 `v2 + LoRA` 一行：可训练参数是两者之和，峰值和单独用 LoRA 或单独用前缀几乎一样。组合的做法有两个坑，下面验证：
#
# 1. `get_peft_model` 会冻结基座里的全部参数，包括先注入的 LoRA（所以 `v2_lora()` 里要重新打开）；
# 2. `save_pretrained()` 只保存前缀（`prompt_embeddings`），LoRA 的权重不在里面，要自己另存。

# %% tags=["combo"]
m = inject_adapter_in_model(LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), build_model("llama-tiny"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    pm = get_peft_model(m, PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=P))
print("get_peft_model 之后可训练的：", [n for n, p in pm.named_parameters() if p.requires_grad])
pm = v2_lora(build_model("llama-tiny"))
with tempfile.TemporaryDirectory() as d:
    pm.save_pretrained(d)
    from safetensors.torch import load_file
    saved = load_file(os.path.join(d, "adapter_model.safetensors"))
print("save_pretrained 存下的：", {k: tuple(v.shape) for k, v in saved.items()})
lora_state = {k: v for k, v in pm.base_model.state_dict().items() if "lora_" in k}
print(f"LoRA 要另存：{len(lora_state)} 个张量，{sum(v.numel() for v in lora_state.values()):,} 个参数，"
      f"例如 {next(iter(lora_state))}")
