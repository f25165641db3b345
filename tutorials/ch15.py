# %% [markdown]
# # 第 15 章 动手实践：嵌入层、输出层和 logits 各占多少显存
#
# 这份教程配合[第 15 章 嵌入层优化](ch15.md)。我们用 `vramlab` 回答五个问题：
#
# 1. 各个模型预设里，嵌入层（词嵌入、位置嵌入、没有绑定时的输出层）占总参数量的多少？
# 2. GPT-2 small 把输入嵌入和输出层绑定（tie）与不绑定，训练一步的峰值差多少？差的是哪几类？
# 3. logits $[b, s, V]$ 在峰值里占多大一块？词表从 32000 涨到 128256 会怎样？分块计算交叉熵能省多少？BF16 autocast 能不能让它变小？
# 4. 混合精度的嵌入表：BF16 表占多少字节？为什么还要 FP32 主权重？
# 5. 嵌入表放在主存（host memory）里时，只把用到的行搬上设备，和把整张表搬上去相比，峰值差多少？只更新用到的行又是怎样做的？稀疏梯度（`sparse=True`）有多大？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 2、3 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行；第 5 节用真实张量。

# %%
import datetime
import functools

import torch
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, get_preset, make_config
from vramlab.reference import reference_rows
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB
from vramlab.workload import from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU                              # 第 2、3 节：模拟设备上用 FakeTensorMode
REF = {r.name: r for r in reference_rows()}
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 嵌入层在参数里占多少
#
# 嵌入表是一个 $V \times d$ 的矩阵（$V$ 是词表大小，$d$ 是隐藏维度），参数量 $V d$，FP32 下 $4Vd$ 字节。GPT-2 还有一张 $1024 \times d$ 的位置嵌入（`wpe`）；输出层（LM head）也是 $V \times d$，GPT-2 默认与词嵌入**绑定**（共享同一个张量），Llama-2-7B 这类模型则不绑定，要再算一份。
#
# 下面在 meta 设备上建出每个预设（不占内存、不花时间），按参数名把嵌入层挑出来；绑定的张量只算一次（`model.parameters()` 本身就会去重）。

# %%
EMBED_KEYS = ("wte", "wpe", "embed_tokens", "lm_head", "word_embeddings", "position_embeddings",
              "token_type_embeddings")


def embedding_share(name):
    with torch.device("meta"):
        model = build_model(name)
    seen, emb, total = set(), 0, 0
    for pname, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if any(k in pname for k in EMBED_KEYS):
            emb += p.numel()
    tied = getattr(model.config, "tie_word_embeddings", True)
    return emb, total, tied


print(pad("预设", 13), pad("V", 7), pad("d", 5), pad("绑定", 5), pad("词嵌入 V·d", 13), pad("占比", 7),
      pad("全部嵌入参数", 14), pad("占比", 7), "总参数")
SHARE = {}
for name in ["tiny", "gpt2-mini", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-1b", "llama-7b"]:
    p = get_preset(name)
    emb, total, tied = embedding_share(name)
    SHARE[name] = (emb, total)
    word = p.vocab * p.hidden
    print(pad(name, 13), pad(str(p.vocab), 7), pad(str(p.hidden), 5), pad("是" if tied else "否", 5),
          pad(f"{word:,}", 13), pad(f"{word / total:.1%}", 7), pad(f"{emb:,}", 14), pad(f"{emb / total:.1%}", 7),
          f"{total:,}")
    key = name.replace("-", "_")
    publish(f"share_{key}_word", f"{word:,}")
    publish(f"share_{key}_word_pct", word / total, fmt="{:.1%}")
    publish(f"share_{key}_all_pct", emb / total, fmt="{:.1%}")
    publish(f"share_{key}_total", f"{total:,}")
small = get_preset("gpt2-small")
publish("share_gpt2_small_word_pct_round", small.vocab * small.hidden / SHARE["gpt2-small"][1], fmt="{:.0%}")

# %% [markdown]
# “全部嵌入参数”包括 GPT-2 的位置嵌入和不绑定时的输出层（`llama-7b` 的 `lm_head`），绑定的输出层不重复计算。同一个词表（50257），模型越小，嵌入层占得越多：gpt2-mini 一半以上的参数在嵌入表里，GPT-2 small 约三成，到 GPT-2 XL 只剩几个百分点，因为 block 的参数按 $12d^2$ 每层增长，嵌入只按 $Vd$ 增长。Llama-3.2-1B 形状（`llama-1b`，$V = 128256$，绑定）的嵌入也超过两成。
#
# ## 2. 绑定与不绑定：训练一步的峰值
#
# `vramlab.models.build_model` 不接受改 config 的参数，所以这里用 `make_config` 取出预设的 config，改掉 `tie_word_embeddings`，再直接用 transformers 的类建模型。训练方法与 H200 参考表一致：FP32 + AdamW，批大小 8，序列长度 512，`labels = input_ids`，热身 1 步后测 1 步的稳态峰值。

# %%
def gpt2_step(cfg, batch=8, seq=512, loss_fn=None):
    """GPT-2 训练一步的稳态峰值（热身 1 步后测 1 步）；返回 (峰值字节, 峰值时刻分类, 峰值位置)。"""
    with vramlab.open_device("auto", fake=FAKE) as dev:
        with torch.device(dev.torch_device):
            torch.manual_seed(0)
            model = transformers.GPT2LMHeadModel(cfg)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev.torch_device)

        def step():
            if loss_fn is None:
                loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = loss_fn(model, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        dev.reset_peak()
        step()
        return dev.max_allocated(), dev.breakdown(), dev.snapshot()["peak_where"]


def config(vocab=50257, tied=True):
    cfg = make_config("gpt2-small")
    cfg.vocab_size = vocab
    cfg.tie_word_embeddings = tied
    return cfg


runs = {("hf", 50257, True): gpt2_step(config()),
        ("hf", 50257, False): gpt2_step(config(tied=False))}

CATS = [("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"),
        ("activations", "激活值"), ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]
tied, untied = runs["hf", 50257, True], runs["hf", 50257, False]
print(pad("类别（峰值时刻）", 20), pad("绑定 MiB", 10), pad("不绑定 MiB", 12), "差")
for key, label in CATS:
    x, y = mib(tied[1].get(key, 0)), mib(untied[1].get(key, 0))
    print(pad(label, 20), pad(f"{x:.1f}", 10), pad(f"{y:.1f}", 12), f"{y - x:+.1f}")
print(pad("峰值", 20), pad(f"{mib(tied[0]):.1f}", 10), pad(f"{mib(untied[0]):.1f}", 12), f"{mib(untied[0] - tied[0]):+.1f}")
for key, label in CATS[:5]:
    x, y = mib(tied[1].get(key, 0)), mib(untied[1].get(key, 0))
    publish(f"tie_{key}_mib", x, fmt="{:.1f}")
    publish(f"untie_{key}_mib", y, fmt="{:.1f}")
    publish(f"untie_{key}_diff_mib", y - x, fmt="{:+.1f}" if abs(y - x) >= 0.05 else "{:.0f}")
publish("tie_peak_mib", mib(tied[0]), fmt="{:.1f}")
publish("untie_peak_mib", mib(untied[0]), fmt="{:.1f}")
publish("untie_peak_diff_mib", mib(untied[0] - tied[0]), fmt="{:.1f}")
publish("untie_param_diff_mib", mib(untied[1]["parameters"] - tied[1]["parameters"]), fmt="{:.1f}")
publish("untie_state_diff_mib", mib(untied[1]["optimizer_state"] - tied[1]["optimizer_state"]), fmt="{:.1f}")
publish("h200_base_mib", REF["small_fp32_adamw_b8_s512"].steady_mib)
publish("tie_vs_h200", abs(mib(tied[0]) / REF["small_fp32_adamw_b8_s512"].steady_mib - 1), fmt="{:.2%}")
V, D = 50257, 768
publish("table_mib", mib(V * D * 4), fmt="{:.1f}")
publish("table_state_mib", mib(V * D * 16), fmt="{:.0f}")          # 权重 + 梯度 + AdamW 两个矩，每参数 16 字节
publish("logits_mib", mib(8 * 512 * V * 4), fmt="{:.0f}")
print(f"\nH200 参考表 small_fp32_adamw_b8_s512（绑定，即 GPT-2 默认）：{REF['small_fp32_adamw_b8_s512'].steady_mib} MiB")
print("峰值出现在：", tied[2] or "（真 GPU 上没有这项信息）")
V, D = 50257, 768
print(f"一张 V×d 的 FP32 表：{V}×{D}×4 字节 = {mib(V * D * 4):.1f} MiB")

# %% [markdown]
# 不绑定多出一张 $V \times d$ 的输出层：参数多 1 张表，AdamW 的一阶矩和二阶矩各多 1 张，峰值时刻一共多出约 3 张表（每张约 147.2 MiB，再按分配器的块大小取整）。梯度那一行两边都是 0：峰值出现在反向刚开始、对 log-softmax 求梯度的时候，这时还没有任何参数梯度（上一步用 `zero_grad(set_to_none=True)` 释放了）。所以按“每参数 16 字节”算，不绑定多出的模型状态是 $16 \times 38.6\text{M}$ 字节 ≈ 589 MiB，但这一步的峰值只多了其中的 12 字节 / 参数。
#
# 再看“激活值”和“临时张量”两行：绑定与否它们完全一样。绑定省的是权重、梯度和优化器状态，省不掉 logits。
#
# ## 3. logits：峰值里最大的单个张量
#
# GPT-2 small 批大小 8、序列长度 512 时，一个 $[8, 512, 50257]$ 的 FP32 张量是 $8 \times 512 \times 50257 \times 4$ 字节 ≈ 785 MiB。峰值时刻显存里最大的几块分配：

# %% tags=["top"]
with vramlab.open_device("auto", fake=FAKE) as dev:
    model = build_model("gpt2-small", device=dev.torch_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, 50257, (8, 512), device=dev.torch_device)
    for _ in range(2):
        if _ == 1:
            dev.reset_peak()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    top = dev.top_allocations(5) if not ON_GPU else []
    del model, opt
print(pad("MiB", 8), pad("算子", 34), pad("位置", 28), "类别")
for t in top:
    print(pad(f"{mib(t['bytes']):.1f}", 8), pad(t["op"], 34), pad(t["where"], 28), t["category"])
if top:
    publish("top_block_mib", mib(top[0]["bytes"]), fmt="{:.1f}")
    publish("top3_sum_mib", sum(round(mib(t["bytes"]), 1) for t in top[:3]), fmt="{:.0f}")

# %% [markdown]
# 前三名都是 $[8, 512, 50257]$ 的 FP32 张量（785.3 MiB 的请求新申请了一段 786 MiB：新段按 2 MiB 取整，段尾不到 1 MiB 的零头不切分，整段记在这个张量名下，见第 11 章）：前向留给反向的 log-softmax 输出，以及反向第一步的两个梯度（`nll_loss` 的梯度和 log-softmax 的梯度）。三者合计约 2358 MiB，占这一步峰值的约三成，比任何一张参数表都大得多。
#
# 词表越大，这三块越大。下面把 GPT-2 small 的词表换成 32000（Llama-2 的大小）和 128256（Llama 3 的大小）再测；同时测一种**分块交叉熵**：先算出最后的隐藏状态，然后每次只取 1024 个 token 乘输出层、算交叉熵，每块用 `checkpoint` 包起来，前向不保存这一块的 logits，反向时再重算。

# %%
def chunked_lm_loss(model, ids, chunk=1024):
    """与 Hugging Face 的损失数值相同（平均到每个被预测的 token），但每次只物化 chunk 行 logits。"""
    h = model.transformer(input_ids=ids).last_hidden_state          # [b, s, d]
    h = h[:, :-1].reshape(-1, h.shape[-1])                           # 位置 t 预测 t+1
    y = ids[:, 1:].reshape(-1)
    w = model.lm_head.weight

    def part(hc, yc):
        return F.cross_entropy((hc @ w.t()).float(), yc, reduction="sum")

    total = 0
    for i in range(0, y.numel(), chunk):
        total = total + checkpoint(part, h[i:i + chunk], y[i:i + chunk], use_reentrant=False)
    return total / y.numel()


# 先确认两种损失数值相同（tiny 模型，真实张量，CPU）
tiny = build_model("tiny")
tiny_ids = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    a = tiny(input_ids=tiny_ids, labels=tiny_ids).loss.item()
    b = chunked_lm_loss(tiny, tiny_ids, chunk=16).item()
print(f"tiny 上的损失：Hugging Face {a:.6f}，分块 {b:.6f}")
publish("tiny_loss_hf", a, fmt="{:.6f}")
publish("tiny_loss_chunked", b, fmt="{:.6f}")

# %%
for vocab in (32000, 50257, 128256):
    for kind in ("hf", "chunked"):
        if (kind, vocab, True) not in runs:
            runs[kind, vocab, True] = gpt2_step(config(vocab), loss_fn=chunked_lm_loss if kind == "chunked" else None)

print(pad("词表 V", 8), pad("3·b·s·V·4 MiB", 15), pad("峰值 MiB", 10), pad("激活值", 8), pad("临时张量", 10),
      pad("分块后峰值", 12), "降幅")
for vocab in (32000, 50257, 128256):
    hf, ch = runs["hf", vocab, True], runs["chunked", vocab, True]
    three = mib(3 * 8 * 512 * vocab * 4)
    print(pad(str(vocab), 8), pad(f"{three:.1f}", 15), pad(f"{mib(hf[0]):.1f}", 10),
          pad(f"{mib(hf[1]['activations']):.1f}", 8), pad(f"{mib(hf[1]['temporaries']):.1f}", 10),
          pad(f"{mib(ch[0]):.1f}", 12), f"{(ch[0] - hf[0]) / hf[0]:+.1%}")
    publish(f"vocab{vocab}_three_mib", three, fmt="{:.1f}")
    publish(f"vocab{vocab}_peak_mib", mib(hf[0]), fmt="{:.1f}")
    publish(f"vocab{vocab}_temporaries_mib", mib(hf[1]["temporaries"]), fmt="{:.1f}")
    publish(f"vocab{vocab}_chunked_mib", mib(ch[0]), fmt="{:.1f}")
    publish(f"vocab{vocab}_change", f"{(ch[0] - hf[0]) / hf[0]:+.1%}".replace("-", "−"))

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")},
             key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

fig, ax = plt.subplots(figsize=(9, 4))
bars = [(v, k) for v in (32000, 50257, 128256) for k in ("hf", "chunked")]
xs = range(len(bars))
bottom = [0.0] * len(bars)
for key, label in CATS:
    vals = [mib(runs[k, v, True][1].get(key, 0)) for v, k in bars]
    if not any(vals):
        continue
    ax.bar(xs, vals, bottom=bottom, label=f"{label} ({key})")
    bottom = [b + x for b, x in zip(bottom, vals)]
ax.set_xticks(list(xs))
ax.set_xticklabels([f"V={v}\n{'HF 损失' if k == 'hf' else '分块 chunked'}" for v, k in bars])
ax.set_ylabel("峰值时刻的已分配显存 (MiB)")
ax.set_title("GPT-2 small, b8 s512, FP32 + AdamW：峰值构成 (peak breakdown)")
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# 词表从 50257 到 128256，峰值从约 7.7 GiB 涨到约 12.0 GiB，其中参数和优化器状态只多了约 680 MiB，其余都是 logits 那三块。分块之后，“log-softmax 输出”不再留到反向，两个梯度也只有一块（1024 行）那么大，峰值降了 15%–34%，词表越大降得越多；块越小省得越多，代价是多一次输出层的矩阵乘（反向里重算 logits）。Liger Kernel 的融合线性交叉熵（fused linear cross entropy）把同样的思路写进一个 Triton 核，还在前向里就把 logits 的梯度算好，省掉这次重算。
#
# BF16 autocast 能不能让 logits 变小？复现 H200 参考表的 `small_bf16autocast_adamw_b8_s512` 这一行看看：

# %%
bf16 = measure_workload(from_reference_name("small_bf16autocast_adamw_b8_s512"), fake=FAKE, steps=1)
fp32 = runs["hf", 50257, True]
print(pad("类别（峰值时刻）", 20), pad("FP32 MiB", 10), "BF16 autocast MiB")
for key, label in CATS:
    print(pad(label, 20), pad(f"{mib(fp32[1].get(key, 0)):.1f}", 10), f"{mib(bf16.breakdown.get(key, 0)):.1f}")
print(pad("峰值", 20), pad(f"{mib(fp32[0]):.1f}", 10), f"{mib(bf16.peak_bytes):.1f}")
print(f"\nH200 参考表：FP32 {REF['small_fp32_adamw_b8_s512'].steady_mib} MiB，"
      f"BF16 autocast {REF['small_bf16autocast_adamw_b8_s512'].steady_mib} MiB")
publish("bf16_peak_mib", mib(bf16.peak_bytes), fmt="{:.1f}")
publish("bf16_temporaries_mib", mib(bf16.breakdown.get("temporaries", 0)), fmt="{:.1f}")
publish("bf16_activations_mib", mib(bf16.breakdown.get("activations", 0)), fmt="{:.1f}")
publish("fp32_activations_mib", mib(fp32[1].get("activations", 0)), fmt="{:.1f}")
publish("fp32_temporaries_mib", mib(fp32[1].get("temporaries", 0)), fmt="{:.1f}")
publish("h200_bf16_mib", REF["small_bf16autocast_adamw_b8_s512"].steady_mib)
publish("autocast_saving", 1 - bf16.peak_bytes / fp32[0], fmt="{:.0%}")

# %% [markdown]
# “临时张量”一行纹丝不动：autocast 下 `lm_head` 输出的 logits 是 BF16，但 Hugging Face 的损失函数（`ForCausalLMLoss`）第一句就是 `logits = logits.float()`，log-softmax 本身也在 autocast 的 FP32 名单里，于是反向开始时那几块 $[b, s, V]$ 的张量仍然是 FP32。激活值少了一截（block 里的矩阵乘输出变成 BF16），参数和优化器状态仍是 FP32。
#
# ## 4. 混合精度的嵌入表
#
# 嵌入表的权重字节数是 $V d \times$ 每元素字节数。把第 1 节的预设换成 BF16 / FP8 / INT8 存放：

# %%
print(pad("预设", 14), pad("嵌入参数", 14), pad("FP32 MiB", 10), pad("BF16 MiB", 10), "1 字节/元素 MiB")
for name in ["gpt2-small", "gpt2-medium", "llama-1b", "llama-7b"]:
    emb = SHARE[name][0]
    print(pad(name, 14), pad(f"{emb:,}", 14), pad(f"{mib(emb * 4):.1f}", 10), pad(f"{mib(emb * 2):.1f}", 10),
          f"{mib(emb):.1f}")
    key = name.replace("-", "_")
    publish(f"bytes_{key}_params", f"{emb:,}")
    publish(f"bytes_{key}_fp32_mib", mib(emb * 4), fmt="{:.1f}")
    publish(f"bytes_{key}_bf16_mib", mib(emb * 2), fmt="{:.1f}")

# %% [markdown]
# 只存 BF16 权重能省一半，但训练时不能只留 BF16：BF16 只有 8 位有效数字（含隐含位），1.0 附近相邻两个数相差 $2^{-7} \approx 0.0078$，比这个小得多的更新会被舍入吞掉。嵌入表每一步只有少数几行拿到梯度、更新量又小，最容易受害：

# %%
w_bf16 = torch.ones(4, dtype=torch.bfloat16)
w_fp32 = torch.ones(4, dtype=torch.float32)
for _ in range(100):                      # 100 步，每步更新 1e-3
    w_bf16 -= 1e-3
    w_fp32 -= 1e-3
print("BF16 权重直接更新 100 次：", w_bf16[0].item())
print("FP32 主权重更新 100 次：  ", round(w_fp32[0].item(), 6), "→ 转成 BF16 后", w_fp32.bfloat16()[0].item())
publish("bf16_after_100", w_bf16[0].item(), fmt="{:.1f}")
publish("fp32_after_100", w_fp32[0].item(), fmt="{:.6f}")

# %% [markdown]
# BF16 权重一步都没动，FP32 主权重准确地走到 0.9。这就是混合精度训练保留 FP32 主权重（master weights）的原因（第 6 章）；8 位优化器的论文同样把嵌入层的优化器状态保留为 32 位。
#
# 再看 autocast 下嵌入层输出的 dtype：`nn.Embedding` 不在 autocast 的任何名单里，输出跟着权重走，仍是 FP32；线性层（包括 `lm_head`）的输出才是 BF16。

# %%
emb = torch.nn.Embedding(1024, 64)
head = torch.nn.Linear(64, 1024, bias=False)
x = torch.randint(0, 1024, (2, 8))
with torch.autocast("cpu", dtype=torch.bfloat16):
    e = emb(x)
    logits = head(e)
print("嵌入输出", e.dtype, "  lm_head 输出", logits.dtype, "  .float() 之后", logits.float().dtype)

# %% [markdown]
# ## 5. 嵌入表放在主存：只搬用到的行
#
# 推荐系统的嵌入表常常大到放不进显存，常见做法之一是把整张表留在主存里，每一步只把这一批用到的行搬上 GPU。这里用 GPT-2 的表（$50257 \times 768$，FP32）和一批 $8 \times 512$ 的 token 演示三种查表方式的设备峰值：
#
# - 整表上设备：`device.to_device(table)[ids]`；
# - 主机上先取行：把 `ids` 拿回主机，在主机上 `table[ids]`，只把 $[8, 512, 768]$ 的结果搬上设备；
# - 去重后搬：只搬这一批里**不同**的那些行，再在设备上按逆索引展开。
#
# 在模拟设备上，`dev.host()` 里创建的张量算主存，不计入显存；`dev.to_device` / `dev.to_host` 相当于 `.to("cuda")` / `.to("cpu")`。

# %%
V, D, B, S = 50257, 768, 8, 512
gen = torch.Generator().manual_seed(0)


def lookup(kind):
    """返回 (设备峰值字节, 经 PCIe 搬上设备的字节, 结果搬回主机用于比较)。"""
    with vramlab.open_device("auto") as dev:
        with dev.host():
            table = torch.randn(V, D, generator=torch.Generator().manual_seed(0))
        ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1)).to(dev.torch_device)
        dev.reset_peak()
        if kind == "整表上设备":
            out = dev.to_device(table)[ids]
            moved = table.nbytes
        elif kind == "主机上先取行":
            ids_h = dev.to_host(ids)
            with dev.host():
                rows = table[ids_h]
            out = dev.to_device(rows)
            moved = rows.nbytes
        else:
            ids_h = dev.to_host(ids)
            with dev.host():
                uniq, inverse = torch.unique(ids_h, return_inverse=True)
                rows = table[uniq]
            out = dev.to_device(rows)[dev.to_device(inverse)]
            moved = rows.nbytes + inverse.nbytes
        peak = dev.max_allocated()
        return peak, moved, dev.to_host(out), (uniq.numel() if kind == "去重后搬" else None)


ref_out = None
print(pad("做法", 16), pad("设备峰值 MiB", 14), pad("搬运 MiB", 10), "结果与整表相同？")
for kind in ("整表上设备", "主机上先取行", "去重后搬"):
    peak, moved, out, nuniq = lookup(kind)
    ref_out = out if ref_out is None else ref_out
    print(pad(kind, 16), pad(f"{mib(peak):.1f}", 14), pad(f"{mib(moved):.1f}", 10), torch.equal(out, ref_out))
    key = {"整表上设备": "whole", "主机上先取行": "rows", "去重后搬": "unique"}[kind]
    publish(f"lookup_{key}_peak_mib", mib(peak), fmt="{:.1f}")
    publish(f"lookup_{key}_moved_mib", mib(moved), fmt="{:.1f}")
    if nuniq is not None:
        print(f"（这一批 {B * S} 个 token 里有 {nuniq} 个不同的 id）")
        publish("lookup_unique_ids", nuniq)

# %% [markdown]
# 整表上设备时峰值是整张表加上结果；在主机上先取行，设备上只有 ids 和 $[8, 512, 768]$ 的结果（12 MiB），搬运量也从整张表降到 12 MiB。去重能进一步减少搬运的行数（这里 4096 个 token 只有三千多个不同的 id；真实文本里高频词反复出现，去重效果更好），代价是设备上多一份去重后的行。
#
# 训练时还要更新这些行。把搬上来的行当作叶子张量求梯度，反向之后只把 $[U, d]$ 的行梯度搬回主机，用 `index_add_` 更新主机上的表（这里用不带动量的 SGD，与整表训练的结果比较）：

# %%
def offload_sgd_step(table, ids, lr=0.1):
    """主机上的表 + 设备上的计算：只搬用到的行上去，只把这些行的梯度搬回来。"""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    rows = table[uniq].clone().requires_grad_(True)          # 真 GPU 上这里是 .to("cuda")
    out = rows[inverse]                                      # [b, s, d]
    loss = (out * out).mean()                                # 随便一个损失
    loss.backward()
    table.index_add_(0, uniq, rows.grad, alpha=-lr)          # 真 GPU 上先 rows.grad.to("cpu")
    return loss.item(), uniq.numel()


small_v, small_d = 1000, 16
t_host = torch.randn(small_v, small_d, generator=torch.Generator().manual_seed(2))
emb_dense = torch.nn.Embedding.from_pretrained(t_host.clone(), freeze=False)
ids_small = torch.randint(0, small_v, (4, 32), generator=torch.Generator().manual_seed(3))
loss_a, n_rows = offload_sgd_step(t_host, ids_small)
loss_b = (emb_dense(ids_small) ** 2).mean()
loss_b.backward()
with torch.no_grad():
    emb_dense.weight -= 0.1 * emb_dense.weight.grad
print(f"损失相同：{loss_a:.6f} / {loss_b.item():.6f}；更新了 {n_rows} 行（共 {small_v} 行）；"
      f"更新后与整表 SGD 的最大差 {(t_host - emb_dense.weight).abs().max().item():.2e}")
mant, exp = f"{(t_host - emb_dense.weight).abs().max().item():.2e}".split("e")
publish("offload_sgd_maxdiff", f"{mant} \\times 10^{{{int(exp)}}}")

# %% [markdown]
# 结果与整表 SGD 一致，而每步经过 PCIe 的只有用到的行和它们的梯度。
#
# PyTorch 自带的另一条路是 `nn.Embedding(..., sparse=True)`：反向得到一个稀疏梯度，只含这一批用到的行。模拟设备目前不跟踪稀疏张量（访问存储会报 `Cannot access storage of SparseTensorImpl`），所以这里直接用张量的字节数比较（CPU 上的真实张量，不是显存读数）：

# %%
ids_big = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
rows_out = {}
for sparse in (False, True):
    e = torch.nn.Embedding(V, D, sparse=sparse)
    e(ids_big).sum().backward()
    g = e.weight.grad
    if g.is_sparse:
        nbytes = g._values().nbytes + g._indices().nbytes
        gc_ = g.coalesce()
        detail = (f"values {tuple(g._values().shape)} + indices {tuple(g._indices().shape)}；"
                  f"合并重复行后 values {tuple(gc_._values().shape)}")
    else:
        nbytes = g.nbytes
        detail = f"稠密 {tuple(g.shape)}"
    print(pad(f"sparse={sparse}", 14), pad(f"{mib(nbytes):.1f} MiB", 12), detail)
    publish(f"grad_{'sparse' if sparse else 'dense'}_mib", mib(nbytes), fmt="{:.1f}")
    if sparse:
        publish("grad_sparse_rows", gc_._values().shape[0])

for opt_cls in (torch.optim.SGD, torch.optim.SparseAdam):
    e = torch.nn.Embedding(V, D, sparse=True)
    opt = opt_cls(e.parameters(), lr=0.1) if opt_cls is torch.optim.SGD else opt_cls(e.parameters())
    e(ids_big).sum().backward()
    opt.step()
    state = sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    print(pad(opt_cls.__name__, 14), f"优化器状态 {mib(state):.1f} MiB")
    publish(f"state_{opt_cls.__name__.lower()}_mib", mib(state), fmt="{:.1f}")
try:
    e = torch.nn.Embedding(V, D, sparse=True)
    e(ids_big).sum().backward()
    torch.optim.AdamW(e.parameters()).step()
except RuntimeError as err:
    print("AdamW + 稀疏梯度：", str(err).splitlines()[0])

# %% [markdown]
# 稀疏梯度只有 $b \cdot s$ 行（未合并时每次出现各占一行，合并后是不同的 id 数），约 12 MiB，而稠密梯度是整张表 147 MiB。但优化器要支持稀疏梯度：`SGD`（不带动量时没有状态）可以；`SparseAdam` 可以，但它的一阶矩和二阶矩仍是两张**稠密**的 $V \times d$ 表（只是每步只更新用到的行）；`AdamW` 直接报错。
#
# 小结一下本教程的数字（模拟设备，FP32 + AdamW，GPT-2 small 批大小 8、序列长度 512）：绑定输入与输出嵌入比不绑定的峰值低约 442 MiB；logits 相关的三块 $[b, s, V]$ 张量占峰值约三成，分块交叉熵把峰值降了 15%–34%（词表 32000–128256），BF16 autocast 动不了它们；嵌入表留在主存、只搬用到的行，设备上只剩 $[b, s, d]$ 的结果。
