# %% [markdown]
# # 第 26 章 动手实践：Prompt Tuning 与 Prefix Tuning 到底省了哪块显存
#
# 这份教程配合[第 26 章 Prefix Tuning 与 Prompt Tuning](ch26.md)。我们用 peft 的 `PromptTuningConfig`（提示微调，Prompt Tuning）和 `PrefixTuningConfig`（前缀微调，Prefix Tuning），在 `llama-tiny`（2 层 Llama 结构，$h = 128$，4 个查询头共享 2 个 KV 头）上回答五个问题：
#
# 1. 两种方法各训练多少参数？公式 $n \cdot d$ 与 $n \cdot L \cdot 2 \cdot d_{kv}$ 和 peft 数出来的一致吗？放到 Llama-2-7B 形状上是多少？
# 2. 训练一步时，全量微调、LoRA、Prompt Tuning、Prefix Tuning 的峰值各由哪几类显存组成？可训练参数少，激活值也少吗？
# 3. 虚拟 token 数 `num_virtual_tokens` 加大时，两种方法的激活值各涨多少？
# 4. 重参数化 MLP（`prefix_projection=True`）训练时多花多少？训练完保存的又是什么？
# 5. 一个冻结的基座加几个任务各自的前缀：切换任务要多少显存？同一个批次里混着几个任务能不能一起算？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。全部用真实张量、FP32。

# %%
import datetime
import logging
import warnings

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # peft 会顺带导入 bitsandbytes：不打印它找不到可选 CPU 内核的提示
warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True")   # float(loss) 的提醒

import matplotlib.pyplot as plt
import peft
import torch
import transformers
from peft import (LoraConfig, PrefixTuningConfig, PromptTuningConfig, TaskType, get_peft_model,
                  get_peft_model_state_dict)
from transformers import DynamicCache

import vramlab
from vramlab.display import banner, mib, pad, use_cjk_font
from vramlab.meter import measure_steps
from vramlab.models import build_model, get_preset
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}，peft {peft.__version__}")
BACKEND = "auto"
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)
publish("peft", peft.__version__)
PRESET = "llama-tiny"
P = get_preset(PRESET)
L, H, HEADS, KV = P.n_layers, P.hidden, P.heads, P.kv_heads
D_KV = KV * H // HEADS                # 每个 token 每层的 K（或 V）宽度：KV 头数 × 每头维度
print(f"{PRESET}：{L} 层，h = {H}，{HEADS} 个查询头，{KV} 个 KV 头，d_kv = {D_KV}，词表 {P.vocab}")

# %% [markdown]
# ## 1. 可训练参数：公式与 peft 的实数
#
# - **Prompt Tuning**（Lester 等，2021）只在输入端拼上 $n$ 个可训练的向量，每个和词嵌入一样宽：$n \cdot d$ 个参数。
# - **Prefix Tuning**（Li & Liang，2021）给**每一层**注意力的键和值各拼上 $n$ 个向量：$n \cdot L \cdot 2 \cdot d_{kv}$ 个参数。普通多头注意力里 $d_{kv} = d$；GQA 模型只有 KV 头那么宽，peft 会按 `num_key_value_heads` 自动缩小。
# - `prefix_projection=True` 时，peft 改为训练一个 $n \times d_{kv}$ 的小嵌入，再经过两层 MLP（`Linear(d_kv, h') → Tanh → Linear(h', 2L·d_kv)`）生成前缀，$h'$ 是 `encoder_hidden_size`，不设时等于 $d_{kv}$。
#
# 下面把 peft 数出的可训练参数和公式放在一起。Llama-2-7B 形状的模型（`llama-7b` 预设）在 meta 设备上建，不占内存。

# %%
N_VT = 20          # 这一节用 20 个虚拟 token


def peft_config(method, n, **kw):
    if method == "lora":
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.0,
                          target_modules=["q_proj", "v_proj"])
    if method == "prompt":
        return PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=n)
    if method == "prefix":
        return PrefixTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=n, **kw)
    raise ValueError(method)


def formula(name, method, n, proj_hidden=None):
    p = get_preset(name)
    d, layers = p.hidden, p.n_layers
    d_kv = p.kv_heads * d // p.heads
    if method == "prompt":
        return n * d
    if proj_hidden is None:
        return n * layers * 2 * d_kv
    hp = proj_hidden
    return n * d_kv + (d_kv * hp + hp) + (hp * 2 * layers * d_kv + 2 * layers * d_kv)


ROWS1 = [("Prompt Tuning", "prompt", {}, None),
         ("Prefix Tuning", "prefix", {}, None),
         ("Prefix + MLP（h' 默认）", "prefix", {"prefix_projection": True}, "default"),
         ("Prefix + MLP（h' = 512）", "prefix", {"prefix_projection": True, "encoder_hidden_size": 512}, 512),
         ("LoRA r=8（q、v）", "lora", {}, None)]
print(pad("模型", 12), pad("方法", 26), pad("peft 可训练参数", 17), pad("公式", 15), "占基座参数")
for name in (PRESET, "llama-7b"):
    p = get_preset(name)
    for label, method, kw, hp in ROWS1:
        with torch.device("meta"):
            model = get_peft_model(build_model(name), peft_config(method, N_VT, **kw))
        trainable, total = model.get_nb_trainable_parameters()
        base = total - trainable
        if method == "lora":
            f = "—"
        else:
            hp_ = (p.kv_heads * p.hidden // p.heads) if hp == "default" else hp
            f = f"{formula(name, method, N_VT, hp_):,}"
        print(pad(name, 12), pad(label, 26), pad(f"{trainable:,}", 17), pad(f, 15), f"{trainable / base:.4%}")
        if name == "llama-7b":
            key = {"Prompt Tuning": "prompt", "Prefix Tuning": "prefix", "Prefix + MLP（h' 默认）": "proj_default",
                   "Prefix + MLP（h' = 512）": "proj512", "LoRA r=8（q、v）": "lora"}[label]
            publish(f"p7_{key}_n", f"{trainable:,}")
            publish(f"p7_{key}_share", trainable / base, fmt="{:.4%}")
            publish(f"p7_{key}_fp32_mb", trainable * 4 / 1e6, fmt="{:.2f}")
            publish(f"p7_{key}_state_gb", trainable * 16 / 1e9, fmt="{:.1f}")
        del model

# %% [markdown]
# 几点读法：
#
# - 公式与 peft 的计数逐个相等。`llama-tiny` 有 GQA（2 个 KV 头），前缀宽 $d_{kv} = 64$ 而不是 $h = 128$；Llama-2-7B 没有 GQA，$d_{kv} = d = 4096$。
# - 在 Llama-2-7B 形状上，20 个虚拟 token 的 Prompt Tuning 只有 81,920 个参数；Prefix Tuning 是 $20 \times 32 \times 2 \times 4096 = 5{,}242{,}880$ 个，和 r = 8 的 LoRA（只挂 q、v）是一个数量级。
# - **重参数化 MLP 可能比前缀本身大得多。** peft 默认 $h' = d_{kv}$，在 7B 上第二个线性层就是 $4096 \times 262{,}144$，可训练参数超过 10 亿，占基座的六分之一；FP32 + AdamW 每个可训练参数 16 字节（参数、梯度、两个矩），这就是十几 GB。用 `prefix_projection=True` 时一定要把 `encoder_hidden_size` 设小。
#
# ## 2. 训练一步：峰值由什么组成
#
# 五种做法（外加一个对照）各训练一步，批大小 4，序列长度 128，FP32 + AdamW，热身 1 步后测 1 步的稳态峰值，`dev.breakdown()` 给出峰值时刻的分类：
#
# | 名称 | 做法 |
# |---|---|
# | 全量微调 | 所有参数都训练 |
# | LoRA | `LoraConfig(r=8, target_modules=["q_proj", "v_proj"])` |
# | Prompt Tuning | `PromptTuningConfig(num_virtual_tokens=16)` |
# | Prefix Tuning | `PrefixTuningConfig(num_virtual_tokens=16)` |
# | Prefix + MLP | 同上，再加 `prefix_projection=True`（$h'$ 默认 64） |
# | 只训最后的 RMSNorm | 对照：可训练参数也很少（128 个），但它们在网络的**最顶端** |
#
# 这么小的模型里，模拟的 cuBLAS 工作区（前向、反向各 32 MiB，按 H200 的设置）是最大的一块，而且各行都一样，所以表里单独列出、峰值也给出扣掉它之后的值。

# %%
B, S, N = 4, 128, 16
LR = 1e-2
CATS = [("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"),
        ("activations", "激活值"), ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]


def prepare(model, method, n=N, **kw):
    """按 method 把模型变成要训练的样子（peft 会冻结基座）。"""
    if method == "full":
        return model
    if method == "norm_only":
        for name, p in model.named_parameters():
            p.requires_grad_(name == "model.norm.weight")
        return model
    if method == "prefix_proj":
        return get_peft_model(model, peft_config("prefix", n, prefix_projection=True, **kw))
    return get_peft_model(model, peft_config(method, n, **kw))


def batch(dev, b=B, s=S, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, P.vocab, (b, s), generator=g).to(dev.torch_device)


def train_peak(method, b=B, **kw):
    with vramlab.open_device(BACKEND) as dev:
        model = prepare(build_model(PRESET, device=dev.torch_device), method, **kw)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=LR)
        ids = batch(dev, b)
        losses = []

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        m = measure_steps(step, dev, warmup=1, steps=1)
        return dict(trainable=sum(p.numel() for p in params), peak=m.peak_bytes, bd=m.breakdown,
                    where=m.peak_where, losses=losses)


METHODS = [("全量微调", "full"), ("LoRA r=8", "lora"), ("Prompt Tuning", "prompt"),
           ("Prefix Tuning", "prefix"), ("Prefix + MLP", "prefix_proj"), ("只训最后的 RMSNorm", "norm_only")]
STEP = {key: train_peak(key) for _, key in METHODS}

print(f"{PRESET}，批大小 {B}，序列长度 {S}，虚拟 token {N} 个，FP32 + AdamW；单位 MiB（峰值时刻）")
print(pad("方法", 20), pad("可训练参数", 11), "".join(pad(zh, 13) for _, zh in CATS), "峰值", " 峰值−cuBLAS")
for zh, key in METHODS:
    r = STEP[key]
    cells = "".join(pad(f"{mib(r['bd'].get(c, 0)):.3f}", 13) for c, _ in CATS)
    ws = r["bd"].get("cuda_overhead", 0)
    print(pad(zh, 20), pad(f"{r['trainable']:,}", 11), cells, pad(f"{mib(r['peak']):.2f}", 6),
          f"{mib(r['peak'] - ws):.2f}")
print("峰值位置：", {key: STEP[key]["where"].split(" @ ")[-1] for _, key in METHODS})
for _, key in METHODS:
    r = STEP[key]
    publish(f"{key}_trainable", f"{r['trainable']:,}")
    for c in ("parameters", "optimizer_state", "activations", "temporaries"):
        publish(f"{key}_{c}_mib", mib(r["bd"].get(c, 0)), fmt="{:.3f}")
    publish(f"{key}_peak_mib", mib(r["peak"]), fmt="{:.2f}")
    publish(f"{key}_net_mib", round(mib(r["peak"]), 2) - round(mib(r["bd"].get("cuda_overhead", 0))), fmt="{:.2f}")
ws = STEP["full"]["bd"].get("cuda_overhead", 0)
publish("ws_mib", mib(ws), fmt="{:.0f}")
publish("ws_each_mib", mib(ws) / 2, fmt="{:.0f}")
full_parts = [round(mib(STEP["full"]["bd"].get(c, 0)), 3) for c in ("parameters", "optimizer_state", "activations", "temporaries")]
publish("full_parts_sum", sum(full_parts), fmt="{:.3f}")
publish("prefix_over_full", (round(mib(STEP["prefix"]["peak"]), 2) - round(mib(ws))) / (round(mib(STEP["full"]["peak"]), 2) - round(mib(ws))), fmt="{:.0%}")
publish("param_mib_1", mib(STEP["full"]["bd"]["parameters"]), fmt="{:.1f}")
publish("prompt_minus_prefix_act_mib", mib(STEP["prompt"]["bd"]["activations"] - STEP["prefix"]["bd"]["activations"]), fmt="{:.1f}")
publish("prompt_minus_prefix_temp_mib", mib(STEP["prompt"]["bd"]["temporaries"] - STEP["prefix"]["bd"]["temporaries"]), fmt="{:.1f}")
publish("norm_logits_mib", B * S * P.vocab * 4 / 2**20, fmt="{:.0f}")            # 一份 FP32 logits（算术）

# %% [markdown]
# 先看“可训练参数”一列和“优化器状态”一列：五种 PEFT 做法的优化器状态都不到 0.2 MiB，是全量微调（4.77 MiB）的零头。梯度一列在峰值时刻都是 0：这几个模型的峰值都出现在交叉熵的反向（`LogSoftmaxBackward0`）里，那时参数梯度还没有生成（`zero_grad(set_to_none=True)` 把上一步的梯度释放了）。
#
# 再看“激活值”一列，这是本章最重要的一点：
#
# - **Prompt Tuning 和 Prefix Tuning 的激活值并没有变成零头。** 它们只比全量微调少了一些，和 LoRA 差不多。原因是可训练的提示在网络的**最底端**（Prompt Tuning 在输入端，Prefix Tuning 在第 1 层也有），反向传播必须从损失一路穿过每一层才能到达它们，所以每一层为反向保存的张量一个都省不掉。
# - 少掉的那部分来自冻结的权重：线性层 $y = xW^\top$ 的权重不需要梯度时，反向只要 $W$ 就能算出 $\partial L / \partial x$，autograd 就不再保存输入 $x$。而 RMSNorm、SiLU、逐元素乘法、注意力这些算子求输入梯度本身就要用到输入，照存不误。
# - 对照行“只训最后的 RMSNorm”可训练参数更少，激活值却小得多：它的参数在最顶端，反向走到它就停了，下面各层从一开始就不用记录计算图。**可训练参数的多少不决定激活值，它们的位置决定。**
# - Prompt Tuning 的激活值比 Prefix Tuning 略大，临时张量也多一点：它把序列从 128 拉长到 144，每一层的每个张量（包括 logits）都长了 $16/128$。
#
# 把各类画成堆叠条形图（扣掉 cuBLAS 工作区）：

# %%
ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
EN = {"full": "full FT", "lora": "LoRA", "prompt": "prompt", "prefix": "prefix",
      "prefix_proj": "prefix+MLP", "norm_only": "top norm only"}
EN_CAT = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
          "activations": "activations", "temporaries": "temporaries"}
fig, ax = plt.subplots(figsize=(8.5, 3.8))
labels = [zh if ZH else EN[key] for zh, key in METHODS]
bottom = [0.0] * len(METHODS)
for c, zh in CATS[:-1]:
    vals = [mib(STEP[key]["bd"].get(c, 0)) for _, key in METHODS]
    ax.bar(labels, vals, bottom=bottom, label=zh if ZH else EN_CAT[c])
    bottom = [b_ + v for b_, v in zip(bottom, vals)]
ax.set_ylabel("峰值时刻 MiB（不含 cuBLAS 工作区）" if ZH else "MiB at the peak (cuBLAS workspace excluded)")
ax.set_title(f"{PRESET}, batch {B}, seq {S}, FP32 + AdamW")
ax.legend(fontsize=8)
plt.xticks(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. 虚拟 token 越多，激活值涨多少
#
# 两种方法把 $n$ 个虚拟 token 放在不同的地方，激活值的增长方式也不同：
#
# - **Prompt Tuning**：序列长度从 $S$ 变成 $S + n$，每一层的每个激活值都按 $(S+n)/S$ 变大，连输出层的 logits 也多出 $B \times n \times V$（虚拟位置也算 logits，只是标签是 −100、不计损失）。
# - **Prefix Tuning**：序列长度不变，只有每层注意力的 K、V 变长：拼接后的 K、V 是 $[B, \text{KV 头}, S + n, \text{每头维度}]$，为反向保存。每层多 $2 \cdot B \cdot n \cdot d_{kv}$ 个元素，$L$ 层就是 $2 L B n d_{kv}$；注意力分数若被显式算出（eager 实现），还会多 $B \cdot \text{头数} \cdot S \cdot n$。
#
# 下面只做一次前向加反向（不建优化器），量“前向结束时为反向保存的激活值”（模拟设备上取 `dev.breakdown(at_peak=False)["activations"]`，即前向里产生、此刻仍活着的张量，含 logits 和损失）以及前向加反向的峰值（扣掉 cuBLAS 工作区）。

# %% tags=["sweep"]
def fwd_bwd(method, n):
    with vramlab.open_device(BACKEND) as dev:
        model = prepare(build_model(PRESET, device=dev.torch_device), method, n=n)
        ids = batch(dev)
        base = dev.allocated()
        dev.reset_peak()
        loss = model(input_ids=ids, labels=ids).loss
        dev.synchronize()
        saved = (dev.allocated() - base) if ON_GPU else dev.breakdown(at_peak=False)["activations"]
        loss.backward()
        dev.synchronize()
        ws = 0 if ON_GPU else dev.breakdown().get("cuda_overhead", 0)
        return saved, dev.max_allocated() - base - ws


NS = [0, 16, 64, 128]
SWEEP = {(method, n): fwd_bwd(method, n) for n in NS[1:] for method in ("prompt", "prefix")}


def frozen_baseline():
    """n = 0 的参照：基座全部冻结，但让嵌入层的输出需要梯度，反向同样要走到最底层。"""
    with vramlab.open_device(BACKEND) as dev:
        model = build_model(PRESET, device=dev.torch_device)
        model.requires_grad_(False)
        model.enable_input_require_grads()
        ids = batch(dev)
        base = dev.allocated()
        dev.reset_peak()
        loss = model(input_ids=ids, labels=ids).loss
        saved = (dev.allocated() - base) if ON_GPU else dev.breakdown(at_peak=False)["activations"]
        loss.backward()
        ws = 0 if ON_GPU else dev.breakdown().get("cuda_overhead", 0)
        return saved, dev.max_allocated() - base - ws


SWEEP[("none", 0)] = frozen_baseline()
s0, p0 = SWEEP[("none", 0)]
print(f"{PRESET}，批大小 {B}，序列长度 {S}，只做一次前向 + 反向；单位 MiB（峰值已扣掉 cuBLAS 工作区）")
print(pad("n", 5), pad("Prompt 保存", 13), pad("Prompt 峰值", 13), pad("Prefix 保存", 13), "Prefix 峰值")
print(pad("0", 5), pad(f"{mib(s0):.3f}", 13), pad(f"{mib(p0):.3f}", 13), pad("—", 13),
      "—（参照：基座全冻结、输入嵌入需要梯度，即 n = 0 的 Prompt Tuning）")
for n in NS[1:]:
    sp, pp = SWEEP[("prompt", n)]
    sx, px = SWEEP[("prefix", n)]
    print(pad(str(n), 5), pad(f"{mib(sp):.3f}", 13), pad(f"{mib(pp):.3f}", 13), pad(f"{mib(sx):.3f}", 13),
          f"{mib(px):.3f}")
dn = NS[-1] - NS[1]
slope_prompt = (SWEEP[("prompt", NS[-1])][0] - SWEEP[("prompt", NS[1])][0]) / dn
slope_prefix = (SWEEP[("prefix", NS[-1])][0] - SWEEP[("prefix", NS[1])][0]) / dn
print(f"\n每多 1 个虚拟 token 多保存的字节（n 从 {NS[1]} 到 {NS[-1]} 的平均）：")
print(f"  Prompt Tuning：{slope_prompt:,.0f} 字节；预测 = 参照行的保存量 / S = {s0 / S:,.0f} 字节")
print(f"  Prefix Tuning：{slope_prefix:,.0f} 字节；预测 2·L·B·h·4 = {2 * L * B * H * 4:,} 字节"
      f"（K、V 复制到 {HEADS} 个查询头）；若按 KV 头 2·L·B·d_kv·4 = {2 * L * B * D_KV * 4:,} 字节")
print(f"  两者之比：{slope_prompt / slope_prefix:.1f} 倍")
publish("slope_prompt", f"{slope_prompt:,.0f}")
publish("slope_prompt_pred", f"{s0 / S:,.0f}")
publish("slope_prefix", f"{slope_prefix:,.0f}")
publish("slope_prefix_pred_q", f"{2 * L * B * H * 4:,}")
publish("slope_prefix_pred_kv", f"{2 * L * B * D_KV * 4:,}")
publish("slope_ratio", slope_prompt / slope_prefix, fmt="{:.1f}")
publish("sweep_n0_saved_mib", mib(s0), fmt="{:.3f}")
for n in NS[1:]:
    publish(f"sweep_prompt_{n}_saved_mib", mib(SWEEP[("prompt", n)][0]), fmt="{:.3f}")
    publish(f"sweep_prefix_{n}_saved_mib", mib(SWEEP[("prefix", n)][0]), fmt="{:.3f}")

# %% [markdown]
# - **Prompt Tuning**：每多一个虚拟 token，保存的激活值就多出“参照行 ÷ $S$”那么多，和预测几乎分毫不差。虚拟 token 就是真 token：每一层、每个算子（包括 logits 和交叉熵）都多处理一个位置。$n = 128$ 时序列翻倍，保存的激活值也翻倍。
# - **Prefix Tuning**：每多一个虚拟 token 只多出每层的一对 K、V。它是按查询头数（$2 L B h$）而不是按 KV 头数（$2 L B d_{kv}$）增长的：有了前缀，键值长度 $n + S$ 不等于查询长度 $S$，因果关系不能再用 SDPA 的 `is_causal` 表达，transformers 会建一个显式的注意力掩码；而 transformers 5.17 的 `sdpa_attention_forward` 只在掩码为 `None` 时使用 SDPA 原生的 GQA，否则先用 `repeat_kv` 把 K、V 复制成查询头数，再保存给反向。所以 GQA 模型加前缀时，K、V 的激活值按查询头数算。
# - 同样的 $n$，Prefix Tuning 的激活值增长比 Prompt Tuning 小一个数量级：前缀不经过 FFN、不产生 logits，也没有自己的查询。
# - 真实模型里这笔账是 $2 L B n h$ 乘每元素字节数：长前缀（例如 Li & Liang 在摘要任务上用的 200 个）时要算进去；注意力的计算量也按 $S \times (S+n)$ 增长。
#
# ## 4. 重参数化 MLP：训练时多花多少，训练完留下什么
#
# Li & Liang 发现直接优化前缀矩阵不稳定，于是用一个小矩阵经过 MLP 生成前缀；训练完只保存 MLP 的输出。peft 的 `prefix_projection=True` 就是这样做的。它的代价有三块：MLP 的参数（见第 1 节）、这些参数的梯度和 AdamW 状态，以及 MLP 的激活值。要注意 peft 是把虚拟 token 的编号先扩展成 $[B, n]$ 再过 MLP 的，所以 MLP 的中间结果有 $B$ 份一模一样的拷贝。
#
# 下面比较不用 MLP、MLP 的 $h'$ 取默认（64）和 512 三种情况（批大小 4 的前两行就是第 2 节的结果），再把批大小加到 16：

# %%
PROJ = [("不用 MLP", "prefix", {}), ("MLP，h' = 64（默认）", "prefix_proj", {}),
        ("MLP，h' = 512", "prefix_proj", {"encoder_hidden_size": 512})]
PROJ_RES = {("不用 MLP", 4): STEP["prefix"], ("MLP，h' = 64（默认）", 4): STEP["prefix_proj"]}   # 第 2 节已经测过
for label, method, kw in PROJ:
    for b in (4, 16):
        if (label, b) not in PROJ_RES and not (b == 16 and label.startswith("MLP，h' = 64")):
            PROJ_RES[(label, b)] = train_peak(method, b=b, **kw)
print(f"{PRESET}，序列长度 {S}，虚拟 token {N} 个，FP32 + AdamW；单位 MiB（峰值时刻）")
print(pad("做法", 22), pad("批大小", 7), pad("可训练参数", 11), pad("优化器状态", 11), pad("激活值", 9),
      pad("激活值比不用 MLP 多", 20), "峰值−cuBLAS")
for label, b in [(lab, b) for lab, _, _ in PROJ for b in (4, 16) if (lab, b) in PROJ_RES]:
    r = PROJ_RES[(label, b)]
    extra = r["bd"].get("activations", 0) - PROJ_RES[("不用 MLP", b)]["bd"].get("activations", 0)
    print(pad(label, 22), pad(str(b), 7), pad(f"{r['trainable']:,}", 11),
          pad(f"{mib(r['bd'].get('optimizer_state', 0)):.3f}", 11),
          pad(f"{mib(r['bd'].get('activations', 0)):.3f}", 9), pad(f"{mib(extra):.3f}", 20),
          f"{mib(r['peak'] - r['bd'].get('cuda_overhead', 0)):.3f}")
for b in (4, 16):
    print(f"预测：批大小 {b}、h' = 512 时 MLP 为反向保存的 [B, n, d_kv] 与 [B, n, h'] = "
          f"{b} × {N} × ({D_KV} + 512) × 4 字节 = {mib(b * N * (D_KV + 512) * 4):.3f} MiB")
    r, r0 = PROJ_RES[("MLP，h' = 512", b)], PROJ_RES[("不用 MLP", b)]
    publish(f"proj512_b{b}_extra_act_mib", mib(r["bd"].get("activations", 0) - r0["bd"].get("activations", 0)), fmt="{:.3f}")
    publish(f"proj512_b{b}_pred_mib", mib(b * N * (D_KV + 512) * 4), fmt="{:.3f}")
for label, key in (("不用 MLP", "noproj"), ("MLP，h' = 512", "proj512")):
    r = PROJ_RES[(label, 4)]
    publish(f"{key}_b4_net_mib", mib(r["peak"] - r["bd"].get("cuda_overhead", 0)), fmt="{:.3f}")

# %% [markdown]
# 在 `llama-tiny` 上，MLP 的参数、优化器状态和 $B$ 份中间结果都不大；但第 1 节已经算过，同样的做法搬到 7B 上，MLP 有 10 亿级参数。训练完之后，peft 保存的是 MLP 算出来的前缀本身：

# %%
pm = get_peft_model(build_model(PRESET), peft_config("prefix", N, prefix_projection=True, encoder_hidden_size=512))
sd = get_peft_model_state_dict(pm)
trainable, _ = pm.get_nb_trainable_parameters()
print("训练时的可训练参数：", f"{trainable:,}")
publish("proj512_trainable", f"{trainable:,}")
publish("saved_shape", str(tuple(next(iter(sd.values())).shape)))
print("get_peft_model_state_dict 保存的张量：", {k: tuple(v.shape) for k, v in sd.items()},
      f"= {sum(v.numel() for v in sd.values()):,} 个数 = n × L × 2 × d_kv = {N * L * 2 * D_KV:,}")
del pm

# %% [markdown]
# 保存的只有 `prompt_embeddings`，形状 $[n, 2L \cdot d_{kv}]$：MLP 只在训练时存在，部署时每个任务仍然只是一小块前缀。（peft 以 `inference_mode=True` 加载这个适配器时，`PrefixEncoder` 直接建一个这么大的嵌入，不再建 MLP。）
#
# ## 5. 多任务：一个冻结的基座，几个前缀
#
# 用 `get_peft_model(..., adapter_name=...)` 和 `add_adapter` 在同一个基座上挂三个任务的前缀，看显存怎么分：

# %%
TASKS = ["translate", "summarize", "classify"]
with vramlab.open_device(BACKEND) as dev:
    base_model = build_model(PRESET, device=dev.torch_device)
    base_bytes = dev.allocated()
    cfg = peft_config("prefix", N)
    mt = get_peft_model(base_model, cfg, adapter_name=TASKS[0])
    per_task = [dev.allocated() - base_bytes]
    for t in TASKS[1:]:
        before = dev.allocated()
        mt.add_adapter(t, peft_config("prefix", N))
        per_task.append(dev.allocated() - before)
    mt.eval()
    ids = batch(dev, b=3, s=32, seed=7)
    # 逐个任务：set_adapter 切换前缀，不分配任何显存
    single = {}
    with torch.no_grad():
        for t in TASKS:
            before = dev.allocated()
            mt.set_adapter(t)
            switch_cost = dev.allocated() - before
            single[t] = mt(input_ids=ids).logits.cpu()
    print(f"基座（{PRESET}）参数：{mib(base_bytes):.3f} MiB")
    print("每个任务的前缀：", [f"{mib(x):.4f} MiB" for x in per_task],
          f"（n × L × 2 × d_kv × 4 字节 = {mib(N * L * 2 * D_KV * 4):.4f} MiB）")
    print(f"set_adapter 切换任务新分配的显存：{switch_cost} 字节")
    print("三个任务的输出两两不同：", all(not torch.allclose(single[a], single[b])
                                    for i, a in enumerate(TASKS) for b in TASKS[i + 1:]))
    print(f"三个任务各存一份全量微调的模型：{mib(3 * base_bytes):.3f} MiB；"
          f"一个基座 + 三个前缀：{mib(base_bytes + sum(per_task)):.3f} MiB")
    publish("mt_base_mib", mib(base_bytes), fmt="{:.3f}")
    publish("mt_per_task_mib", "、".join(sorted({f"{mib(x):.4f}" for x in per_task})))      # 各任务相同时只有一个数
    publish("mt_formula_mib", mib(N * L * 2 * D_KV * 4), fmt="{:.4f}")
    publish("mt_extra_bytes", "、".join(sorted({str(x - N * L * 2 * D_KV * 4) for x in per_task})))
    publish("mt_switch_bytes", switch_cost)
    publish("mt_three_full_mib", mib(3 * base_bytes), fmt="{:.3f}")
    publish("mt_shared_mib", mib(base_bytes + sum(per_task)), fmt="{:.3f}")


# %% [markdown]
# 切换任务就是换一个活动的前缀，基座一字节不动。那同一个批次里能不能混着几个任务？peft 的 `adapter_names=[...]` 混合批次目前只支持 LoRA 这类改权重的方法；前缀方法要自己拼，但拼法很直接：前缀本来就是每个样本一份的 K/V（peft 也是把它按批大小扩展的），只要第 $i$ 行用第 $i$ 个样本所属任务的前缀，就得到一个混合批次的缓存。下面照着 peft `get_prompt` 的形状变换手写一遍，再和逐个任务单独算的结果对比：

# %%
def mixed_prefix_cache(model, task_of_row):
    """每一行用自己任务的前缀，拼成一个 DynamicCache（形状变换与 peft 的 get_prompt 相同）。"""
    cfg = model.peft_config[task_of_row[0]]
    n, heads = cfg.num_virtual_tokens, cfg.num_attention_heads
    rows = []
    for t in task_of_row:
        tokens = model.prompt_tokens[t][:n].unsqueeze(0).to(model.prompt_encoder[t].embedding.weight.device)
        rows.append(model.prompt_encoder[t](tokens))                       # [1, n, 2L·d_kv]
    kv = torch.cat(rows)                                                     # [B, n, 2L·d_kv]
    kv = kv.view(len(task_of_row), n, cfg.num_layers * 2, heads, cfg.token_dim // heads)
    return DynamicCache(kv.permute(2, 0, 3, 1, 4).split(2))                 # 每层一对 [B, 头, n, 每头维度]


with vramlab.open_device(BACKEND) as dev:
    base_model = build_model(PRESET, device=dev.torch_device)
    mt = get_peft_model(base_model, peft_config("prefix", N), adapter_name=TASKS[0])
    for t in TASKS[1:]:
        mt.add_adapter(t, peft_config("prefix", N))
    mt.eval()
    ids = batch(dev, b=3, s=32, seed=7)
    with torch.no_grad():
        ref = []
        for i, t in enumerate(TASKS):                 # 参照：第 i 行单独用任务 i 的前缀
            mt.set_adapter(t)
            ref.append(mt(input_ids=ids[i:i + 1]).logits)
        ref = torch.cat(ref).cpu()
        cache = mixed_prefix_cache(mt, TASKS)          # 一个批次：三行三个任务
        mixed = mt.get_base_model()(input_ids=ids, past_key_values=cache).logits.cpu()
print("混合批次的输出形状：", tuple(mixed.shape))
print("与逐个任务单独计算一致：", torch.allclose(mixed, ref, atol=1e-5),
      f"（最大差 {float((mixed - ref).abs().max()):.2e}）")
publish("mixed_max_diff", f"{float((mixed - ref).abs().max()):.2e}")

# %% [markdown]
# 混合批次与逐个任务算的结果一致。服务多个任务时，这意味着一个基座、一次前向就能同时回答不同任务的请求，每个请求只多带 $L \times 2 \times n \times d_{kv}$ 个数的前缀（Prompt Tuning 更简单：每行在输入嵌入前拼上自己任务的那 $n$ 个向量即可；peft 的 `MultitaskPromptTuningConfig` 用 `task_ids` 参数支持这种批次）。
#
# ## 小结
#
# - 可训练参数：Prompt Tuning $n \cdot d$，Prefix Tuning $n \cdot L \cdot 2 \cdot d_{kv}$；重参数化 MLP 训练时另算，$h'$ 不设小时可能比前缀大几个数量级。
# - 梯度和优化器状态随可训练参数一起变成零头，但激活值没有：提示在网络底端，反向要穿过整个网络。省掉的只有冻结线性层的输入。
# - 虚拟 token 数：Prompt Tuning 让每层的激活值按 $(S+n)/S$ 变大（含 logits），Prefix Tuning 只让每层 K、V 变长。
# - 多任务：一个基座 + 每任务一小块前缀；切换任务零分配，混合批次可以按行拼前缀。
