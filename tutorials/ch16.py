# %% [markdown]
# # 第 16 章 动手实践：多头注意力、GQA 与 MQA 的显存账
#
# 这份教程配合[第 16 章 注意力机制优化](ch16.md)，回答四个问题：
#
# 1. 多头注意力（MHA）、分组查询注意力（GQA）、多查询注意力（MQA）的权重和推理时的键值缓存（KV cache）各多大？用 Llama 2 / Llama 3 的真实形状算一遍。
# 2. 在设备上真的做一次预填充（prefill），Hugging Face 的 `DynamicCache` 占的显存和公式 $2 \cdot L \cdot n_{kv} \cdot d \cdot S \cdot B \cdot$ 字节数对得上吗？
# 3. 训练时 GQA 能省多少？（`llama-tiny` 的三种 KV 头数；Llama-3.2-1B 形状的 MHA 与 GQA-8）
# 4. 同一个 GQA 注意力，用 `repeat_interleave` 把 K、V 复制到查询头数、和用 `F.scaled_dot_product_attention(..., enable_gqa=True)`，峰值差多少？结果一样吗？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 3 节的 Llama-3.2-1B 形状在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行，其余各节用真实张量。

# %%
import datetime
import math

import torch
import torch.nn.functional as F
import transformers

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import make_config
from vramlab.sim.kernels import cuda_kernel_for
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU          # 第 3 节的 1B 模型：模拟设备上用 FakeTensorMode
print("transformers", transformers.__version__)
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)

# %% [markdown]
# ## 1. 算一笔账：权重与 KV 缓存
#
# 设隐藏维度为 $h$，查询头数为 $a$，每个头的维度为 $d$（$h = a d$），键值头数为 $n_{kv}$。一层注意力有四个投影矩阵：$W_Q$、$W_O$ 是 $h \times h$；$W_K$、$W_V$ 是 $h \times n_{kv} d$。MHA 时 $n_{kv} = a$，四个矩阵共 $4h^2$ 个参数；GQA / MQA 把后两个缩小为 $n_{kv}/a$ 倍。
#
# 推理时每生成一个 token，每层都要把它的 K、V 存进缓存。整个缓存的字节数是
#
# $$M_{\text{KV}} = 2 \cdot L \cdot n_{kv} \cdot d \cdot S \cdot B \cdot \text{每个元素的字节数}$$
#
# 其中 $L$ 是层数，$S$ 是已缓存的序列长度，$B$ 是批大小，开头的 2 代表 K 和 V 各一份。下面用 BF16（2 字节）和几种公开模型的配置（`config.json`）算一遍。“若改为 MHA”“若改为 MQA”两行是假想的对照，不是真实模型。

# %%
MODELS = [  # 名字, 层数 L, 隐藏维度 h, 查询头 a, 键值头 n_kv
    ("Llama-2-7B（MHA）", 32, 4096, 32, 32),
    ("Llama-2-7B 若改为 MQA", 32, 4096, 32, 1),
    ("Llama-3-8B（GQA-8）", 32, 4096, 32, 8),
    ("Llama-2-70B（GQA-8）", 80, 8192, 64, 8),
    ("Llama-2-70B 若改为 MHA", 80, 8192, 64, 64),
]
BYTES = 2          # BF16


def kv_bytes(L, n_kv, d, S, B, nbytes=BYTES):
    return 2 * L * n_kv * d * S * B * nbytes


def attn_weights(h, a, n_kv):
    d = h // a
    return 2 * h * h + 2 * h * n_kv * d          # W_Q、W_O + W_K、W_V


print(pad("模型", 26), pad("注意力权重/层", 16), pad("KV 缓存/token", 16), pad("S=4096,B=1", 13), "S=4096,B=16")
for name, L, h, a, n_kv in MODELS:
    d = h // a
    w = attn_weights(h, a, n_kv)
    per_tok = kv_bytes(L, n_kv, d, 1, 1)
    print(pad(name, 26), pad(f"{w / 1e6:.1f} M 参数", 16), pad(f"{per_tok / 1024:.0f} KiB", 16),
          pad(f"{kv_bytes(L, n_kv, d, 4096, 1) / 2**30:.2f} GiB", 13), f"{kv_bytes(L, n_kv, d, 4096, 16) / 2**30:.1f} GiB")
    key = {"Llama-2-7B（MHA）": "l2_7b", "Llama-2-7B 若改为 MQA": "l2_7b_mqa", "Llama-3-8B（GQA-8）": "l3_8b",
           "Llama-2-70B（GQA-8）": "l2_70b", "Llama-2-70B 若改为 MHA": "l2_70b_mha"}[name]
    publish(f"kv_{key}_per_token_kib", per_tok / 1024, fmt="{:.0f}")
    publish(f"kv_{key}_s4096_b1_gib", kv_bytes(L, n_kv, d, 4096, 1) / 2**30, fmt="{:g}")
    publish(f"kv_{key}_s4096_b16_gib", kv_bytes(L, n_kv, d, 4096, 16) / 2**30, fmt="{:g}")

# %% [markdown]
# 几点读法：
#
# - Llama-2-7B 每个 token 的缓存是 $2 \times 32 \times 32 \times 128 \times 2$ 字节 = 512 KiB；4096 个 token 就是 2 GiB，批大小 16 时 32 GiB，已经和 BF16 权重本身（约 13 GB）一个量级。
# - Llama-2-70B 用 8 个 KV 头：每 token 320 KiB；若用 64 个 KV 头的 MHA，是 2560 KiB，8 倍。批大小 16、4096 个 token 时，缓存从 20 GiB 变成 160 GiB，这就是大模型推理普遍采用 GQA 的原因。
# - 注意力权重也变小了（70B 每层从 268 M 降到 151 M 参数），但这部分在训练和推理里都只是一次性的常数；KV 缓存随 $S \times B$ 增长，才是 GQA / MQA 主要针对的对象。
#
# 把缓存随序列长度的增长画出来（批大小 1，BF16）：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")},
             key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

SEQS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
fig, ax = plt.subplots(figsize=(7.5, 4))
for (name, L, h, a, n_kv), style in zip(MODELS, ["o-", "v:", "s-", "^-", "d--"]):
    ax.plot(SEQS, [kv_bytes(L, n_kv, h // a, s, 1) / 2**30 for s in SEQS], style, label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xticks(SEQS, [str(s) for s in SEQS])
ax.set_xlabel("序列长度 sequence length (tokens)")
ax.set_ylabel("KV 缓存 KV cache (GiB), batch 1, BF16")
ax.set_title("KV 缓存随序列长度线性增长 / KV cache grows linearly with length")
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. 在设备上量一次 KV 缓存
#
# `vramlab` 的 `llama-tiny` 是 2 层的 Llama 结构（$h = 128$，$a = 4$，$d = 32$），预设带 2 个 KV 头（GQA）；`llama-tiny-mqa` 只有 1 个 KV 头。再把 `num_key_value_heads` 改成 4，得到同样形状的 MHA。三者用 FP32 权重，在设备上对批大小 8、长度 512 的输入做一次预填充（`use_cache=True`），保留返回的 `past_key_values`，量它占的显存：
#
# $$M_{\text{KV}} = 2 \times 2 \times n_{kv} \times 32 \times 512 \times 8 \times 4\ \text{字节} = 2\,n_{kv}\ \text{MiB}$$

# %% tags=["prefill"]
VARIANTS = [("MHA（4 个 KV 头）", 4), ("GQA（llama-tiny，2 个 KV 头）", 2), ("MQA（llama-tiny-mqa，1 个 KV 头）", 1)]


def tiny_config(n_kv):
    cfg = make_config("llama-tiny")
    cfg.num_key_value_heads = n_kv
    return cfg


def warm_up(dev):
    """先做一次带反向的矩阵乘：cuBLAS 工作区（前向、反向线程各一块）事先分配好，不算进后面的差值。"""
    x = torch.ones(8, 8, device=dev.torch_device, requires_grad=True)
    (x @ x).sum().backward()


def prefill_cache(n_kv, B=8, S=512):
    cfg = tiny_config(n_kv)
    with vramlab.open_device("auto") as dev:
        warm_up(dev)
        torch.manual_seed(0)
        with torch.device(dev.torch_device):
            model = transformers.LlamaForCausalLM(cfg)
        model.eval()
        ids = torch.randint(0, cfg.vocab_size, (B, S), device=dev.torch_device)
        with torch.no_grad():
            before = dev.allocated()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)   # 只算最后一个位置的 logits
            cache = out.past_key_values
            del out
            held = dev.allocated() - before          # 预填充结束后仍占着的显存：就是缓存
        shape = tuple(cache.layers[0].keys.shape)
        direct = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return held, direct, shape


print(pad("注意力", 34), pad("每层 K 的形状", 20), pad("设备上仍占用", 14), pad("缓存张量合计", 14), "公式")
for label, n_kv in VARIANTS:
    held, direct, shape = prefill_cache(n_kv)
    formula = 2 * 2 * n_kv * 32 * 512 * 8 * 4
    print(pad(label, 34), pad(str(shape), 20), pad(f"{mib(held):.2f} MiB", 14), pad(f"{mib(direct):.2f} MiB", 14),
          f"{mib(formula):.2f} MiB")

# %% [markdown]
# 三列一致：预填充之后留在显存里的，正好是每层 `[B, n_kv, S, d]` 的 K 和 V。缓存的形状里是 KV 头数而不是查询头数：Hugging Face 的实现只存 `n_kv` 个头，计算注意力时再让多个查询头共享它们。
#
# 只量一个长度还看不出“随 $S$ 线性增长”。把预填充长度从 64 加到 512（`llama-tiny` 的 `max_position_embeddings`），每个长度、每种注意力各量一次，再和第 1 节的 `kv_bytes` 公式画在一起：

# %%
SWEEP = [64, 128, 256, 384, 512]
sweep = {n_kv: [prefill_cache(n_kv, S=s)[0] for s in SWEEP] for _, n_kv in VARIANTS}
print(pad("S", 6), *(pad(label.split("（")[0] + " MiB", 12) for label, _ in VARIANTS), "与公式的最大差（字节）")
worst_all = 0
for i, s in enumerate(SWEEP):
    worst = max(abs(sweep[n_kv][i] - kv_bytes(2, n_kv, 32, s, 8, 4)) for _, n_kv in VARIANTS)
    worst_all = max(worst_all, worst)
    print(pad(str(s), 6), *(pad(f"{mib(sweep[n_kv][i]):.2f}", 12) for _, n_kv in VARIANTS), worst)
publish("sweep_readings", len(SWEEP) * len(VARIANTS))
publish("sweep_worst_bytes", worst_all)

fig, ax = plt.subplots(figsize=(7.5, 4))
for (label, n_kv), marker in zip(VARIANTS, "os^"):
    (line,) = ax.plot(SWEEP, [mib(kv_bytes(2, n_kv, 32, s, 8, 4)) for s in SWEEP], "--", lw=1, alpha=0.7)
    ax.plot(SWEEP, [mib(b) for b in sweep[n_kv]], marker, color=line.get_color(), label=f"{label} 实测")
ax.plot([], [], "k--", lw=1, alpha=0.7, label="公式 2·L·n_kv·d·S·B·4 字节")
ax.set_xticks(SWEEP)
ax.set_xlabel("预填充长度 S (tokens)")
ax.set_ylabel("预填充后仍占用的显存 (MiB)")
ax.set_title("llama-tiny 的 KV 缓存：实测 vs 公式 (B = 8, FP32)")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 每个点都落在虚线上：缓存与 $S$ 成正比，也与 $n_{kv}$ 成正比，MHA 的 4 个 KV 头是 MQA 的 4 倍。
#
# 生成阶段每一步往缓存里追加一个位置。`DynamicCache` 用 `torch.cat` 追加，每一步都会短暂地同时持有旧缓存和新缓存；想让显存曲线平稳，可以用预先分配好最大长度的 `StaticCache`（`generate(..., cache_implementation="static")`）。两者缓存本身的大小都由上面的公式决定。

# %% [markdown]
# ## 3. 训练时 GQA 省多少
#
# 训练不需要 KV 缓存。GQA 在训练中省下的只有两样：$W_K$、$W_V$ 变小带来的参数、梯度和优化器状态；以及为反向保存的 K、V 变小（每层少 $2 \cdot b \cdot s \cdot (h - n_{kv} d)$ 个元素）。查询、注意力输出、MLP 的激活值都不变。开 BF16 autocast 时还有第三样，第 3 节后半会量出来。
#
# 先看 `llama-tiny` 的三个变体：FP32 + AdamW，批大小 8、序列长度 512，跑两步取第二步（优化器状态已经建好）的峰值。

# %%
def train_peak(cfg, B, S, steps=2, fake=False, autocast=None):
    with vramlab.open_device("auto", fake=fake) as dev:
        torch.manual_seed(0)
        with torch.device(dev.torch_device):
            model = transformers.LlamaForCausalLM(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if steps else None
        ids = torch.randint(0, cfg.vocab_size, (B, S), device=dev.torch_device)
        for _ in range(max(steps, 1)):
            dev.reset_peak()
            with torch.autocast(dev.type, dtype=autocast, enabled=autocast is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
        return n_params, dev.max_allocated(), dev.breakdown()


CATS = [("parameters", "参数"), ("optimizer_state", "优化器状态"), ("activations", "激活值"),
        ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]
tiny = {label: train_peak(tiny_config(n_kv), B=8, S=512) for label, n_kv in VARIANTS}
print(pad("峰值时刻（MiB）", 18), *(pad(label.split("（")[0], 10) for label, _ in VARIANTS))
print(pad("参数量", 18), *(pad(f"{tiny[label][0]:,}", 10) for label, _ in VARIANTS))
for key, name in CATS:
    print(pad(name, 18), *(pad(f"{mib(tiny[label][2].get(key, 0)):.2f}", 10) for label, _ in VARIANTS))
print(pad("峰值", 18), *(pad(f"{mib(tiny[label][1]):.2f}", 10) for label, _ in VARIANTS))
for (label, n_kv), key in zip(VARIANTS, ("mha", "gqa", "mqa")):
    publish(f"tiny_{key}_peak_mib", mib(tiny[label][1]), fmt="{:.2f}")
    publish(f"tiny_{key}_act_mib", mib(tiny[label][2].get("activations", 0)), fmt="{:.2f}")

# %% [markdown]
# 从 MHA 到 MQA，峰值只降了几 MiB。激活值的差正好是 K、V 投影输出的差：MHA → GQA 每层少 $2 \times 8 \times 512 \times 64$ 个 FP32 元素，2 层共 4 MiB。`llama-tiny` 的词表和 MLP 占了参数的大头，注意力里能省的 $W_K$、$W_V$ 只是一小部分。
#
# 换成真实规模的形状再看一次：Llama-3.2-1B 的配置（16 层，$h = 2048$，32 个查询头，$d = 64$，8 个 KV 头，词表 128256），对照把 KV 头改成 32 的 MHA 版本。BF16 autocast（FP32 权重），批大小 1、序列长度 2048，只做一次前向加反向（不含优化器，模型状态另用参数量换算）。

# %%
def llama1b(n_kv):
    cfg = make_config("llama-1b")
    cfg.num_key_value_heads = n_kv
    return cfg


big = {n_kv: train_peak(llama1b(n_kv), B=1, S=2048, steps=0, fake=FAKE, autocast=torch.bfloat16) for n_kv in (32, 8)}
print(pad("Llama-3.2-1B 形状", 22), pad("参数量", 16), pad("AdamW 模型状态", 16), pad("激活值（峰值时刻）", 20), "前向+反向峰值")
for n_kv, label in [(32, "MHA（32 个 KV 头）"), (8, "GQA-8（原版）")]:
    n, peak, bd = big[n_kv]
    states = n * 16        # FP32 权重 4 + 梯度 4 + Adam m 4 + v 4 字节
    print(pad(label, 22), pad(f"{n:,}", 16), pad(f"{states / 2**30:.2f} GiB", 16),
          pad(f"{mib(bd.get('activations', 0)):.0f} MiB", 20), f"{mib(peak):.0f} MiB")
d_act = big[32][2]["activations"] - big[8][2]["activations"]
for n_kv, key in ((32, "mha"), (8, "gqa")):
    publish(f"big_{key}_states_gib", big[n_kv][0] * 16 / 2**30, fmt="{:.2f}")
    publish(f"big_{key}_peak_mib", mib(big[n_kv][1]), fmt="{:.0f}")
publish("big_param_diff", f"{big[32][0] - big[8][0]:,}")
publish("big_act_diff_mib", mib(d_act), fmt="{:.0f}")
publish("big_peak_cut", 1 - big[8][1] / big[32][1], fmt="{:.0%}")
print(f"\n激活值之差 {mib(d_act):.0f} MiB；公式 16 层 × 2（K、V）× 2048 × (2048 − 8×64) × 2 字节 = "
      f"{mib(16 * 2 * 2048 * (2048 - 8 * 64) * 2):.0f} MiB")

# %% [markdown]
# 8 个 KV 头比 32 个少了约 1 亿参数（每层 $2 \times 2048 \times 1536$），在 FP32 + AdamW 下是 1.5 GiB 的模型状态。激活值少了 384 MiB，恰好是上面公式（每层 K、V 之差，192 MiB）的两倍。这个“两倍”是巧合吗？只看一个序列长度分不出来。下面换几个 $S$，量前向结束、反向之前比前向开始时多占的显存（为反向留着的一切），并且和不开 autocast 的 FP32 对照：

# %%
def held_after_forward(cfg, S, autocast):
    """前向结束、反向之前，比前向开始时多占的显存（字节）：为反向留着的一切。"""
    with vramlab.open_device("auto", fake=FAKE) as dev:
        with torch.device(dev.torch_device):
            model = transformers.LlamaForCausalLM(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, S), device=dev.torch_device)
        before = dev.allocated()
        with torch.autocast(dev.type, dtype=autocast, enabled=autocast is not None):
            loss = model(input_ids=ids, labels=ids).loss
        return dev.allocated() - before


def act_diff(S, autocast):
    """32 个与 8 个 KV 头时，前向结束后多占的显存之差（字节）。"""
    return held_after_forward(llama1b(32), S, autocast) - held_after_forward(llama1b(8), S, autocast)


KV_COLS = 2048 - 8 * 64                   # 每层 W_K（或 W_V）少掉的输出列数
W_COPY = 16 * 2 * 2048 * KV_COLS * 2      # autocast 为 W_K、W_V 缓存的 BF16 副本之差（字节），与 S 无关
print(pad("S", 6), pad("BF16 autocast 实测差", 22), pad("其中 K、V（公式）", 18), pad("余下", 10),
      pad("FP32 实测差", 14), "FP32 的 K、V（公式）")
for seq in (512, 1024, 2048):
    d16, d32 = act_diff(seq, torch.bfloat16), act_diff(seq, None)
    kv16, kv32 = 16 * 2 * seq * KV_COLS * 2, 16 * 2 * seq * KV_COLS * 4
    print(pad(str(seq), 6), pad(f"{mib(d16):.0f} MiB", 22), pad(f"{mib(kv16):.0f} MiB", 18), pad(f"{mib(d16 - kv16):.0f} MiB", 10),
          pad(f"{mib(d32):.0f} MiB", 14), f"{mib(kv32):.0f} MiB")
    for key, v in (("bf16", d16), ("bf16_kv", kv16), ("bf16_rest", d16 - kv16), ("fp32", d32), ("fp32_kv", kv32)):
        publish(f"gqa_s{seq}_{key}_mib", mib(v), fmt="{:.0f}")
print(f"\nautocast 的 BF16 权重副本之差：16 层 × 2（W_K、W_V）× 2048 × {KV_COLS} × 2 字节 = {mib(W_COPY):.0f} MiB")
publish("gqa_weight_copy_mib", mib(W_COPY), fmt="{:.0f}")

# %% [markdown]
# 拆开来看就清楚了：
#
# - **FP32、不开 autocast** 时，激活值之差每个 $S$ 都正好是一份 K、V：每层少 $2 \cdot b \cdot s \cdot (h - n_{kv} d)$ 个元素。K 投影的输出要先经过 RoPE，RoPE 乘的 cos、sin 不需要梯度，所以旋转前的 K 不为反向保存；V 投影的输出和 SDPA 保存的 V 是同一块存储。没有显式掩码时 transformers 给 SDPA 传 `enable_gqa=True`（见正文），SDPA 保存的就是 8 个头的原件。于是每层只少一份 K、一份 V。
# - **BF16 autocast** 时多出一块不随 $S$ 变的 192 MiB：autocast 把 FP32 的 $W_K$、$W_V$ 转成 BF16 副本去做矩阵乘，这些副本在前向里缓存、并被保存给反向（求输入的梯度要用权重），模拟设备在前向里产生的存储都记在“激活值”一类。$W_K$、$W_V$ 变小，副本也跟着变小。
#
# $S = 2048$ 时两部分恰好相等，只因为这里 $b \cdot s = 1 \times 2048$ 正好等于 $h = 2048$；$S = 512$ 时就是 48 + 192 MiB。对训练来说，这些节省是实打实的，但远不如推理时 KV 缓存缩小 4 倍那么显著。

# %% [markdown]
# ## 4. `repeat_interleave` 还是 `enable_gqa=True`
#
# GQA 的计算本身很简单：第 $i$ 个查询头用第 $\lfloor i / g \rfloor$ 个 KV 头，$g = a / n_{kv}$ 是每组的查询头数。最直接的写法是先把 K、V 沿头维度复制 $g$ 份，再调用普通的 SDPA；评分练习的起始代码就是这样写的。PyTorch 2.5 起，SDPA 有了 `enable_gqa=True` 参数，直接接受头数较少的 K、V。
#
# 下面比较三种写法：批大小 2，8 个查询头，2 个 KV 头（$g = 4$），序列长度 1024，头维度 64，因果注意力，FP32 和 BF16 各跑一遍（真卡上 GQA 训练该用 BF16，见正文；评分练习也用 BF16）。一个 `[2, 8, 1024, 64]` 的 FP32 张量是 4 MiB，K、V 本身各 1 MiB；BF16 减半。“额外峰值”是一次前向加反向的峰值减去调用前已分配的显存。

# %% tags=["gqa_compare"]
B, HQ, HKV, S, D = 2, 8, 2, 1024, 64


def gqa_repeat(q, k, v):
    """起始代码的写法：把 K、V 复制到查询头数（物化出新的张量），再走普通 SDPA。"""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_expand(q, k, v):
    """transformers 的 repeat_kv：先 expand（视图），再 reshape；reshape 遇到非连续的视图同样会复制。"""
    b, n_kv, s, d = k.shape
    g = q.shape[1] // n_kv
    k = k[:, :, None].expand(b, n_kv, g, s, d).reshape(b, n_kv * g, s, d)
    v = v[:, :, None].expand(b, n_kv, g, s, d).reshape(b, n_kv * g, s, d)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_native(q, k, v):
    """不复制：让 SDPA 自己按组索引 KV 头。"""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def run_attention(fn, dtype=torch.float32, hq=HQ, hkv=HKV):
    """在设备上跑一次前向 + 反向：返回额外峰值、前向后多占的显存、保存给反向的张量（按存储去重）、输出和梯度。"""
    gen = torch.Generator().manual_seed(0)
    host = [torch.randn(B, h, S, D, generator=gen).to(dtype) for h in (hq, hkv, hkv, hq)]
    saved = {}

    def pack(t):
        st = t.untyped_storage()
        saved.setdefault((st.data_ptr(), st.nbytes()), tuple(t.shape))
        return t

    with vramlab.open_device("auto") as dev:
        warm_up(dev)
        q, k, v, g = (dev.to_device(t) for t in host)
        for t in (q, k, v):
            t.requires_grad_(True)
        dev.reset_peak()
        before = dev.allocated()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn(q, k, v)
        after_fwd = dev.allocated() - before
        out.backward(g)
        extra = dev.max_allocated() - before
        result = dict(extra=extra, fwd=after_fwd, saved=saved, out=out.detach().cpu(),
                      grads=[t.grad.cpu() for t in (q, k, v)])
    return result


IMPLS = [("repeat_interleave（起始代码）", gqa_repeat), ("expand + reshape（repeat_kv）", gqa_expand),
         ("SDPA enable_gqa=True", gqa_native)]
DTYPES = (torch.float32, torch.bfloat16)
res = {(dt, label): run_attention(fn, dtype=dt) for dt in DTYPES for label, fn in IMPLS}
for dt in DTYPES:
    base = res[(dt, IMPLS[0][0])]
    print(str(dt).replace("torch.", ""))
    print(pad("  写法", 32), pad("前向后多占 MiB", 16), pad("额外峰值 MiB", 14), pad("相对起始代码", 14), pad("输出最大差", 12), "梯度最大差")
    for label, _ in IMPLS:
        r = res[(dt, label)]
        dout = (r["out"].float() - base["out"].float()).abs().max().item()
        dgrad = max((a.float() - b.float()).abs().max().item() for a, b in zip(r["grads"], base["grads"]))
        print(pad("  " + label, 32), pad(f"{mib(r['fwd']):.2f}", 16), pad(f"{mib(r['extra']):.2f}", 14),
              pad(f"{r['extra'] / base['extra']:.2f}", 14), pad(f"{dout:.1e}", 12), f"{dgrad:.1e}")
    dname = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dt]
    gqa = res[(dt, IMPLS[2][0])]
    publish(f"repeat_{dname}_extra_mib", mib(base["extra"]), fmt="{:.2f}")
    publish(f"gqa_{dname}_extra_mib", mib(gqa["extra"]), fmt="{:.2f}")
    publish(f"gqa_{dname}_ratio", gqa["extra"] / base["extra"], fmt="{:.2f}")
    publish(f"repeat_{dname}_fwd_mib", mib(base["fwd"]), fmt="{:.2f}")
    publish(f"gqa_{dname}_fwd_mib", mib(gqa["fwd"]), fmt="{:.2f}")
    publish(f"expand_{dname}_extra_mib", mib(res[(dt, IMPLS[1][0])]["extra"]), fmt="{:.2f}")

# %% [markdown]
# 看看两种写法各自给反向留下了什么（按存储去重，只列 1 MiB 及以上的张量）。两边的第一行都是输入 q，最后一行都是 SDPA 的输出（内核按 `[B, S, H, D]` 的布局写出）：

# %%
for label in (IMPLS[0][0], IMPLS[2][0]):
    print(label, "（FP32）")
    for (_, nbytes), shape in res[(torch.float32, label)]["saved"].items():
        if nbytes >= 2**20:
            print("   ", pad(str(shape), 22), f"{mib(nbytes):.2f} MiB")
copies = [nb for (_, nb), shape in res[(torch.float32, IMPLS[0][0])]["saved"].items() if shape == (B, HQ, S, D)]
publish("repeat_saved_copy_mib", mib(copies[-1]), fmt="{:.0f}")      # 复制出来的 K（或 V），[B, HQ, S, D]

# %% [markdown]
# 起始代码保存的 K、V 是复制出来的两份 `[2, 8, 1024, 64]`（各 4 MiB，是原来的 $g = 4$ 倍），原始的 k、v 反而用不上了，反向时 dK、dV 也先以 8 个头的大小算出来，再由 `repeat_interleave` 的反向按组求和回 2 个头。`enable_gqa=True` 保存的只有原始的 q、k、v、输出和每行的 log-sum-exp（`[2, 8, 1024]` 的 FP32，不到 1 MiB，没列出来），dK、dV 直接按 2 个头累加——这正是 FlashAttention-2 论文第 3.1 节描述的做法：不复制 KV 头，只在内核里换算索引，反向时把同组查询头的梯度加到同一个 KV 头上。
#
# 两种 dtype 的结论相同：BF16 下 `enable_gqa=True` 的额外峰值是起始代码的 0.32 倍，FP32 下是 0.42 倍（BF16 时比值更小，是因为复制写法在反向里还有 FP32 的累加缓冲区，见下一段）。输出完全相同；梯度的差来自求和顺序不同：FP32 时在 FP32 舍入误差的量级，BF16 时大得多，因为起始代码在 BF16 里按组累加 dK、dV，融合核用 FP32 累加。
#
# 最后，模拟设备按 CUDA 调度规则给每种输入挑 SDPA 的核（`vramlab.sim.kernels.cuda_kernel_for`）。它把头数不同的输入排除在 flash 之外，交给 memory-efficient 核记账：

# %%
gen = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for hkv in (HQ, HKV):
        q = torch.randn(1, HQ, 16, D, dtype=dtype, generator=gen)
        k = torch.randn(1, hkv, 16, D, dtype=dtype, generator=gen)
        print(pad(f"{str(dtype).replace('torch.', '')}，{HQ} 个查询头 / {hkv} 个 KV 头", 36), "→", cuda_kernel_for(q, k, k, None, 0.0))

# %% [markdown]
# 这是模拟设备的简化，和文档不一致：torch 2.13 的文档写明 GQA 在 CUDA 上目前只在 flash 和 math 两个核上可用，真卡上 BF16 / FP16 的 GQA 应当走 flash。好在两个核为反向**保存**的张量相同（原始的 q、k、v，输出，每行的 log-sum-exp），前向之后的显存一样；差别只在反向时的临时缓冲区：模拟设备给 flash 记一个 FP32 的 dQ 累加器，给 memory-efficient 只记一个 `[B, H, L]` 的 FP32 缓冲区；而 FlashAttention-2 的反向遇到 GQA 时，还会先按全部查询头分配 dK、dV 的临时张量，算完再按组求和（`flash_api.cpp` 的 `dk_expanded`、`dv_expanded`）。所以真卡上 BF16 的 `enable_gqa=True` 前向后多占的显存与这里相同，反向的额外峰值会比这里高，比值也会高一些；保存的张量不复制这一点不变。**FP32 输入**则不同：按文档它会退回 math 实现，而 math 实现内部会自己复制 K、V，并保存 $S \times S$ 的概率矩阵，上面 FP32 那张表在真卡上可能得出相反的结论。所以在真卡上用 `enable_gqa=True` 时，请用 BF16/FP16，并用 `sdpa_kernel` 确认后端。
#
# 本教程的显存数字都在模拟设备上测得，它们是确定的：换一台没有 GPU 的机器重跑，结果相同。梯度的“最大差”不是：它来自浮点求和的顺序，随 CPU 线程数和机器略有不同（在 1e-6 的量级）。模拟设备不计时间。
