# %% [markdown]
# # 第 17 章 动手实践：FFN、SwiGLU 与 MoE 各占多少显存
#
# 这份教程配合[第 17 章 前馈网络优化](ch17.md)。我们用 `vramlab` 回答五个问题：
#
# 1. 一个 Transformer 层里，前馈网络（FFN）占多少参数？GPT-2 的 4h MLP、Llama 的 SwiGLU、Mixtral 的 MoE 各是多少？MoE 的“总参数”和“每个 token 用到的参数”差多少？
# 2. FFN 在前向时给反向留下多少激活值？GELU、HF GPT-2 的 `gelu_new`、SwiGLU 各存了哪些张量？重算激活函数、整块重算各省多少？
# 3. 训练一步时，`llama-tiny`（SwiGLU）和 `moe-tiny`（4 个专家、每个 token 选 2 个）的峰值差在哪里？
# 4. 手写一个 MoE 层：让每个专家算全部 token 再用掩码挑（稠密写法），和只把 token 送给它选中的专家（分发写法），峰值差多少？容量因子（capacity factor）决定的分发缓冲区有多大、会丢掉多少 token？
# 5. 专家并行：2 个 gloo 进程各持一半专家，用 all-to-all 交换 token，结果和单进程一致吗？每个 rank 的专家权重是不是减半？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。本教程全部用真实张量（MoE 的路由依赖数据，不能只用形状来“跑”）。

# %%
import datetime
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.display import banner, mib, pad, free_port
from vramlab.estimate import estimate
from vramlab.models import build_model, get_preset
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB
from vramlab.workload import Workload

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner(f"transformers {transformers.__version__}")
BACKEND = "auto"
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)

# %% [markdown]
# ## 1. FFN 在参数里占多少
#
# 设隐藏维度为 $h$。GPT-2 的 MLP 是两个线性层 $h \to 4h \to h$，权重 $2 \cdot 4h^2 = 8h^2$；注意力的 Q、K、V 和输出投影是 $4h^2$。所以每层约 $12h^2$ 个参数里，FFN 占 $8h^2$，即三分之二。
#
# SwiGLU 有三个矩阵（门控 `gate_proj`、升维 `up_proj`、降维 `down_proj`），中间维度记为 $f$，参数 $3hf$。要和 4h MLP 的参数量持平，$f = \tfrac{2}{3} \cdot 4h$。Meta 的 Llama 代码先算 `int(2 * 4h / 3)`，再向上取整到 `multiple_of = 256` 的倍数（下面第一段代码）。
#
# MoE 把一个 FFN 换成 $E$ 个（每个都是 SwiGLU），再加一个 $E \times h$ 的路由器（router）；每个 token 只走其中 $k$ 个。
#
# 下面在 meta 设备上（不占内存）建出各个模型，按参数名把 FFN（名字里带 `mlp`）挑出来。Mixtral-8x7B 用 transformers 的 `MixtralConfig` 按官方 config 的形状建（$h = 4096$，$f = 14336$，32 层，8 个专家，top-2，32 个查询头、8 个 KV 头，词表 32000，输入嵌入与输出层不绑定）。

# %%
def llama_ffn_dim(h, multiple_of=256):
    hidden = int(2 * 4 * h / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)

for h in (4096, 5120):
    print(f"h = {h}：2/3·4h = {2 * 4 * h / 3:.2f}，取整到 256 的倍数 → {llama_ffn_dim(h)}")
print("llama-7b 预设（Llama-2-7B 形状）的 intermediate_size：", get_preset("llama-7b").ffn_hidden)
print("llama-tiny 预设：h = 128，intermediate_size =", get_preset("llama-tiny").ffn_hidden,
      f"（2/3·4h = {2 * 4 * 128 / 3:.1f}，取整到 8 的倍数）")


def mixtral_8x7b():
    cfg = transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                     num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
    with torch.device("meta"):
        return transformers.MixtralForCausalLM(cfg)


def ffn_table(name, model):
    cfg = model.config
    total = ffn = experts = 0
    for pname, p in model.named_parameters():
        total += p.numel()
        if ".mlp." in pname:
            ffn += p.numel()
            if ".experts." in pname:
                experts += p.numel()
    E = getattr(cfg, "num_local_experts", 0)
    k = getattr(cfg, "num_experts_per_tok", 0)
    active = total - experts * (E - k) // E if E else total   # 每个 token 只用 k/E 的专家
    return dict(name=name, layers=cfg.num_hidden_layers if hasattr(cfg, "num_hidden_layers") else cfg.n_layer,
                total=total, ffn=ffn, active=active)


rows = []
for name in ("tiny", "gpt2-small", "llama-tiny", "llama-7b", "moe-tiny"):
    rows.append(ffn_table(name, build_model(name, device="meta")))
rows.append(ffn_table("Mixtral-8x7B", mixtral_8x7b()))
print()
print(pad("模型", 14), pad("总参数", 16), pad("FFN 参数", 16), pad("FFN 占比", 9), "每个 token 用到的参数")
for r in rows:
    print(pad(r["name"], 14), pad(f"{r['total']:,}", 16), pad(f"{r['ffn']:,}", 16),
          pad(f"{r['ffn'] / r['total']:.1%}", 9), f"{r['active']:,}")
MIX = rows[-1]
for r in rows:
    key = r["name"].lower().replace("-", "_")
    publish(f"ffn_{key}_total", f"{r['total']:,}")
    publish(f"ffn_{key}_ffn", f"{r['ffn']:,}")
    publish(f"ffn_{key}_share", r["ffn"] / r["total"], fmt="{:.1%}")
    publish(f"ffn_{key}_active", f"{r['active']:,}")

# %% [markdown]
# - GPT-2 small 的 FFN 占全部参数的 45.5%，而不是 $8/12$：它的词嵌入（$50257 \times 768$）本身就占了约三成（见第 15 章）。只看 Transformer 层，FFN 正好是 $8h^2 / 12h^2$（加上偏置略多一点）。
# - Llama-2-7B 形状的 FFN 占全部参数的 64.2%：每层 FFN 是 $3 \times 4096 \times 11008 = 135{,}266{,}304$ 个参数，注意力是 $4 \times 4096^2 = 67{,}108{,}864$ 个，FFN 是注意力的两倍多；剩下的是嵌入层和输出层。
# - Mixtral-8x7B 一共 46,702,792,704 个参数，其中 96.6% 在专家里；每个 token 只经过 8 个专家中的 2 个，用到的参数是 12,879,925,248 个。这就是官方说的“46.7B 总参数、每个 token 用 12.9B”。
#
# **显存按总参数算，计算量按激活参数算。** 训练时每个专家都要有权重、梯度和优化器状态，不管这一步有没有 token 选中它。混合精度 + Adam 每个参数 16 字节：

# %%
for label, n in (("总参数", MIX["total"]), ("每个 token 用到的参数", MIX["active"])):
    print(f"Mixtral-8x7B {pad(label, 22)} {n / 1e9:6.2f}B × 16 字节 = {n * 16 / 1e9:7.1f} GB")
print(f"只存 BF16 权重（推理）：{MIX['total'] * 2 / 1e9:.1f} GB ≈ {MIX['total'] * 2 / 2**30:.1f} GiB")
publish("mix_state_gb", MIX["total"] * 16 / 1e9, fmt="{:.1f}")
publish("mix_active_state_gb", MIX["active"] * 16 / 1e9, fmt="{:.1f}")
publish("mix_bf16_gb", MIX["total"] * 2 / 1e9, fmt="{:.1f}")
publish("mix_bf16_gib", MIX["total"] * 2 / 2**30, fmt="{:.1f}")

# %% [markdown]
# 模型状态要 747.2 GB，而“12.9B 激活参数”对应的 206.1 GB 只是计算量的尺度，不是显存的尺度。连推理时只放 BF16 权重也要 93.4 GB，一张 80 GB 的卡放不下。
#
# ## 2. FFN 的激活值：GELU、SwiGLU 和两种重算
#
# 反向传播时，线性层要用它的输入求权重梯度，激活函数要用它的输入（或输出）求导。Korthikanti 等人（2022）按 16 位精度、带 dropout 数过 GPT 的 MLP：第一层线性的输入 $2sbh$、GELU 的输入 $8sbh$、第二层线性的输入 $8sbh$、dropout 掩码 $sbh$，合计 $19sbh$ 字节。
#
# 下面用 $h = 768$ 手写五种 FFN，参数量相同（4h MLP 是 $2 \times 768 \times 3072$，SwiGLU 取 $f = 2048 = \tfrac{2}{3} \cdot 3072$，都是 4,718,592 个权重，不带偏置），在同一批 $n = 1024$ 个 token 上（FP32，无 dropout）数前向之后多出来的字节（去掉输出本身），就是留给反向的激活值：
#
# | 名称 | 写法 |
# |---|---|
# | `gelu` | `fc2(F.gelu(fc1(x), approximate="tanh"))`：一个融合的 GELU 算子，只存输入 |
# | `gelu_new` | HF GPT-2 的 `NewGELUActivation`：用 Python 写出 $0.5x(1 + \tanh(\sqrt{2/\pi}(x + 0.044715x^3)))$，每一步都存东西 |
# | `swiglu` | Llama：`down(F.silu(gate(x)) * up(x))` |
# | `swiglu_recompute` | 自定义 autograd 函数只存 `gate(x)` 和 `up(x)`，反向时重算 SiLU 和乘积（Liger Kernel 的 `LigerSiLUMulFunction` 就是这样做的） |
# | `swiglu_ckpt` | 用 `torch.utils.checkpoint` 把整个 SwiGLU 包起来，只存输入 |

# %% tags=["ffn"]
H, N_TOK = 768, 512
F4, FSW = 4 * H, 2 * 4 * H // 3         # 3072 与 2048


class GeluMLP(nn.Module):
    def __init__(self, new_gelu=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(H, F4, bias=False), nn.Linear(F4, H, bias=False)
        self.act = transformers.activations.NewGELUActivation() if new_gelu else (
            lambda t: F.gelu(t, approximate="tanh"))

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SiLUMul(torch.autograd.Function):
    """silu(g) * u：前向只存 g 和 u，反向重算 silu(g)。"""

    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy):
        g, u = ctx.saved_tensors
        sig = torch.sigmoid(g)
        silu = g * sig
        return dy * u * sig * (1 + g * (1 - sig)), dy * silu


class SwiGLU(nn.Module):
    def __init__(self, mode="plain"):
        super().__init__()
        self.gate, self.up = nn.Linear(H, FSW, bias=False), nn.Linear(H, FSW, bias=False)
        self.down = nn.Linear(FSW, H, bias=False)
        self.mode = mode

    def _body(self, x):
        if self.mode == "recompute":
            return self.down(SiLUMul.apply(self.gate(x), self.up(x)))
        return self.down(F.silu(self.gate(x)) * self.up(x))

    def forward(self, x):
        if self.mode == "ckpt":
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


VARIANTS = {"gelu": lambda: GeluMLP(), "gelu_new": lambda: GeluMLP(new_gelu=True),
            "swiglu": lambda: SwiGLU(), "swiglu_recompute": lambda: SwiGLU("recompute"),
            "swiglu_ckpt": lambda: SwiGLU("ckpt")}


def ffn_memory(make):
    """(保存给反向的字节（按存储去重，不含权重，含 FFN 的输入）, 前向+反向的峰值增量, 输入梯度, 参数量)"""
    with vramlab.open_device(BACKEND) as dev:
        with torch.device(dev.torch_device):
            torch.manual_seed(0)
            mlp = make()
            x = torch.randn(N_TOK, H, requires_grad=True)
        mlp(x).sum().backward()                   # 热身：cuBLAS 工作区等一次性分配
        x.grad = None
        for p in mlp.parameters():
            p.grad = None
        weights = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
        saved = {}

        def pack(t):                              # 记下每个被保存张量的存储（权重本来就常驻，不算）
            st = t.untyped_storage()
            if st.data_ptr() not in weights:
                saved[st.data_ptr()] = st.nbytes()
            return t

        dev.empty_cache()                         # 让每次测量从同样的分配器状态开始
        dev.synchronize()
        base = dev.allocated()
        dev.reset_peak()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = mlp(x * 1.0)                      # FFN 的输入是个新张量（模型里是 LayerNorm 的输出）
        y.sum().backward()
        dev.synchronize()
        peak = dev.max_allocated() - base
        return sum(saved.values()), peak, x.grad.detach().cpu().clone(), sum(p.numel() for p in mlp.parameters())


UNIT = N_TOK * H * 4     # 一个 [n, h] 的 FP32 张量
FFN = {name: ffn_memory(make) for name, make in VARIANTS.items()}
print(f"n = {N_TOK} 个 token，h = {H}，FP32；一个 [n, h] 张量 = {mib(UNIT):.0f} MiB")
print(pad("写法", 18), pad("权重个数", 11), pad("保存的张量 MiB", 15), pad("折合 [n,h] 个数", 16), "前向+反向峰值增量 MiB")
for name, (saved, peak, _, n) in FFN.items():
    print(pad(name, 18), pad(f"{n:,}", 11), pad(f"{mib(saved):.2f}", 15), pad(f"{saved / UNIT:.2f}", 16),
          f"{mib(peak):.2f}")
g0 = FFN["swiglu"][2]
for name, (saved, peak, _, n) in FFN.items():
    publish(f"ffn_{name}_units", saved / UNIT, fmt="{:.2f}")
    publish(f"ffn_{name}_peak_mib", mib(peak), fmt="{:.0f}")
print("三种 SwiGLU 的输入梯度一致：",
      all(torch.allclose(FFN[k][2], g0, atol=1e-5) for k in ("swiglu_recompute", "swiglu_ckpt")))

# %% [markdown]
# 按“几个 $[n, h]$ 张量”读这张表（$f = 4h$ 或 $\tfrac{8}{3}h$）：
#
# - `gelu`：$h + 4h + 4h = 9$ 个，就是 Korthikanti 公式里的 $2 + 8 + 8$（16 位时每个元素 2 字节）。
# - `gelu_new`：21 个。Python 写出来的 GELU 每一步（`pow`、`tanh`、`1 + tanh`、`0.5 * x`）都各存一个 $4h$ 的张量，比融合的 GELU 多存 3 个 $4h$，这也是 `vramlab` 估算器对 GPT-2 的建模方式。
# - `swiglu`：$h + 4 \times \tfrac{8}{3}h \approx 11.67$ 个。门控输出 `gate(x)`（SiLU 的输入）、`silu(gate)` 和 `up(x)`（乘法的两个操作数）、乘积（`down` 的输入）各一个 $f$。参数和 4h MLP 一样多，激活值却多了约 30%。
# - `swiglu_recompute`：只存 `gate(x)`、`up(x)` 和乘积，9 个，和融合 GELU 持平；代价是反向时多算一次 sigmoid。
# - `swiglu_ckpt`：只剩输入 1 个，代价是反向时把三个矩阵乘重算一遍。
#
# 最后一列是**单独一层**前向加反向的峰值增量，它讲的是另一件事：
#
# - `swiglu_recompute` 的峰值（42 MiB）反而比不重算（34 MiB）还高。这里的反向是用 Python 写的，`sigmoid`、`g * sig` 等每一步都产生一个 $f$ 宽的临时张量。Liger Kernel 的 Triton 内核把这些算在寄存器里，还把梯度直接写回 `g`、`u` 的缓冲区，才没有这笔开销：重算要配融合内核（kernel fusion）才划算。
# - `swiglu_ckpt` 的峰值和不重算一样：反向时整块重算，被丢掉的张量又全部回来了一次。
#
# 真实模型有 $L$ 层，“保存的张量”要在整个前向里累积 $L$ 份，而反向的临时张量一次只出现一层。所以层数多时，决定峰值的是第一列；第 7 章的激活检查点也是同样的道理。
#
# ## 3. 训练一步：llama-tiny 对 moe-tiny
#
# `moe-tiny` 是 Mixtral 结构：和 `llama-tiny` 一样 2 层、$h = 128$，但每层的 FFN 换成 4 个专家（每个 $f = 256$ 的 SwiGLU），每个 token 选 2 个。FP32 + AdamW，批大小 4，序列长度 128，热身 1 步后测 1 步的稳态峰值。同时打印 `vramlab estimate` 的估算值。

# %%
CATS = [("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"),
        ("activations", "激活值"), ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]
STEP = {}
for name in ("llama-tiny", "moe-tiny"):
    w = Workload(model=name, batch=4, seq=128)
    STEP[name] = (measure_workload(w, backend=BACKEND, steps=1), estimate(w))
print(pad("峰值时刻的类别", 20), pad("llama-tiny MiB", 16), "moe-tiny MiB")
for key, zh in CATS:
    a, b = (STEP[n][0].breakdown.get(key, 0) for n in ("llama-tiny", "moe-tiny"))
    print(pad(zh, 20), pad(f"{mib(a):.2f}", 16), f"{mib(b):.2f}")
print(pad("峰值（实测）", 20), pad(f"{mib(STEP['llama-tiny'][0].peak_bytes):.2f}", 16),
      f"{mib(STEP['moe-tiny'][0].peak_bytes):.2f}")
print(pad("峰值（估算器）", 20), pad(f"{mib(STEP['llama-tiny'][1].total_bytes):.2f}", 16),
      f"{mib(STEP['moe-tiny'][1].total_bytes):.2f}")
print("参数个数：", {n: STEP[n][0].trainable_params for n in STEP})
print("峰值位置：", STEP["moe-tiny"][0].peak_where)
for name in ("llama-tiny", "moe-tiny"):
    key = name.replace("-tiny", "")
    m, est = STEP[name]
    for cat in ("parameters", "optimizer_state", "activations", "cuda_overhead"):
        publish(f"step_{key}_{cat}_mib", mib(m.breakdown.get(cat, 0)), fmt="{:.2f}")
    publish(f"step_{key}_peak_mib", mib(m.peak_bytes), fmt="{:.2f}")
    publish(f"step_{key}_est_mib", mib(est.total_bytes), fmt="{:.2f}")
publish("step_cuda_overhead_mib", mib(STEP["moe-tiny"][0].breakdown.get("cuda_overhead", 0)), fmt="{:.0f}")
publish("step_act_growth", STEP["moe-tiny"][0].breakdown["activations"] / STEP["llama-tiny"][0].breakdown["activations"] - 1,
        fmt="{:.0%}")
publish("step_moe_est_gap_mib", abs(mib(STEP["moe-tiny"][0].peak_bytes - STEP["moe-tiny"][1].total_bytes)), fmt="{:.2f}")

# %% [markdown]
# 参数和优化器状态几乎翻倍（4 个专家的 FFN 比 1 个 FFN 多了 3 份），而激活值只多了约 37%：每个 token 只走 2 个专家，专家里的激活值是“$k$ 份 SwiGLU”，外加收集起来的专家输入输出和路由器的 logits。两个模型的峰值都出现在交叉熵反向时。这么小的模型里，64 MiB 的 cuBLAS 工作区（前向、反向各一份 32 MiB，模拟 H200）反而是最大的一块，读表时把它扣掉再比。
#
# 估算器的预测与实测相差不到 0.4 MiB：`vramlab estimate` 已经把 MoE 的激活值（$k$ 倍的 SwiGLU、路由 logits、收集的专家输入输出）算进去了，可以直接用它估大模型。
#
# ## 4. 手写 MoE 层：稠密写法与分发写法
#
# 一个最简单的 MoE 层：路由器 $W_r \in \mathbb{R}^{E \times h}$ 给每个 token 打分，softmax 后取前 $k$ 个，权重归一化；专家 $e$ 是 $h \to 4h \to h$ 的 GELU MLP（$h$ 是模型宽度，代码里叫 `D`），权重 `w_in[e]`（$4h \times h$）和 `w_out[e]`（$h \times 4h$）；输出是被选中的 $k$ 个专家输出的加权和。
#
# - **稠密写法**：每个专家都算全部 $T$ 个 token，再用门控权重（没选中的为 0）加权求和。写起来最简单，但 $4h$ 宽的中间张量是 $[E, T, 4h]$，是分发写法的 $E/k$ 倍。
# - **分发写法**：对每个专家，找出选中它的 token（`nonzero`），只把这些行收集（gather）出来算，再按 token 下标加回（scatter-add，`index_add_`）。每个专家平均只处理 $Tk/E$ 个 token。

# %%
def route(x, router_weight, top_k):
    probs = (x @ router_weight.T).softmax(dim=-1)            # [T, E]；路由 logits 只有 T×E
    top_v, top_i = probs.topk(top_k, dim=-1)                  # [T, k]
    return probs, top_v / top_v.sum(dim=-1, keepdim=True), top_i


def moe_dense(x, router_weight, w_in, w_out, top_k):
    probs, top_v, top_i = route(x, router_weight, top_k)
    gates = torch.zeros_like(probs).scatter(1, top_i, top_v)   # [T, E]，没选中的是 0
    h = F.gelu(torch.einsum("td,efd->etf", x, w_in))           # [E, T, 4h]：每个专家算全部 token
    y = torch.einsum("etf,edf->etd", h, w_out)                 # [E, T, h]
    return torch.einsum("etd,te->td", y, gates)


def moe_dispatch(x, router_weight, w_in, w_out, top_k):
    probs, top_v, top_i = route(x, router_weight, top_k)
    out = torch.zeros_like(x)
    for e in range(w_in.shape[0]):
        tok, slot = (top_i == e).nonzero(as_tuple=True)       # 选中专家 e 的 token 及其第几选
        if tok.numel() == 0:
            continue
        h = F.gelu(x[tok] @ w_in[e].T)                        # 只算 Tk/E 左右个 token
        out.index_add_(0, tok, (h @ w_out[e].T) * top_v[tok, slot, None])
    return out


T_MOE, D, E, K = 2048, 128, 8, 2


def moe_memory(fn):
    with vramlab.open_device(BACKEND) as dev:
        with torch.device(dev.torch_device):
            g = torch.Generator(device=dev.torch_device).manual_seed(0)
            x = torch.randn(T_MOE, D, generator=g, device=dev.torch_device, requires_grad=True)
            router = (torch.randn(E, D, generator=g, device=dev.torch_device) / D**0.5).requires_grad_()
            w_in = (torch.randn(E, 4 * D, D, generator=g, device=dev.torch_device) / D**0.5).requires_grad_()
            w_out = (torch.randn(E, D, 4 * D, generator=g, device=dev.torch_device) / (4 * D)**0.5).requires_grad_()
        params = (x, router, w_in, w_out)
        fn(x, router, w_in, w_out, K).square().sum().backward()      # 热身
        for p in params:
            p.grad = None
        dev.empty_cache()
        dev.synchronize()
        base = dev.allocated()
        n0 = 0 if ON_GPU else len(dev.snapshot()["timeline"])      # 只画测量的这一次
        dev.reset_peak()
        y = fn(x, router, w_in, w_out, K)
        y.square().sum().backward()
        dev.synchronize()
        peak = dev.max_allocated() - base
        tl = [t["allocated"] - base for t in dev.snapshot()["timeline"][n0:]] if not ON_GPU else []
        return peak, y.detach().cpu(), [p.grad.detach().cpu() for p in params], tl


MOE = {name: moe_memory(fn) for name, fn in (("dense", moe_dense), ("dispatch", moe_dispatch))}
(pd, yd, gd, _), (pp, yp, gp, _) = MOE["dense"], MOE["dispatch"]
print(f"T = {T_MOE} 个 token，h = {D}，E = {E} 个专家，top-{K}，FP32")
print(f"稠密写法：前向+反向峰值增量 {mib(pd):7.2f} MiB")
print(f"分发写法：前向+反向峰值增量 {mib(pp):7.2f} MiB   （{pp / pd:.1%}）")
print("输出一致：", torch.allclose(yd, yp, atol=1e-5),
      "  四个梯度一致：", all(float((a - b).norm() / b.norm()) < 1e-5 for a, b in zip(gd, gp)))
print(f"参考：一个 [E, T, 4h] 的 FP32 张量 = {mib(E * T_MOE * 4 * D * 4):.0f} MiB，"
      f"一个 [Tk, 4h] = {mib(T_MOE * K * 4 * D * 4):.0f} MiB")
publish("moe_dense_mib", mib(pd), fmt="{:.2f}")
publish("moe_dispatch_mib", mib(pp), fmt="{:.2f}")
publish("moe_dispatch_share", pp / pd, fmt="{:.1%}")

# %% [markdown]
# 两种写法的输出和梯度一致，分发写法的峰值增量只有稠密写法的一小部分：稠密写法存了 $[E, T, 4h]$ 的 GELU 输入和输出，分发写法只存每个专家自己那 $Tk/E$ 行。本章的评分练习（`ch17-moe`）就是把稠密写法改成分发写法。
#
# 把两次的已分配显存（相对起点）画在一起：

# %%
import matplotlib
import matplotlib.pyplot as plt
from matplotlib import font_manager

_cjk = [f.name for f in font_manager.fontManager.ttflist
        if any(k in f.name for k in ("Noto Sans CJK", "Noto Serif CJK", "Source Han", "WenQuanYi", "SimHei"))]
if _cjk:
    matplotlib.rcParams["font.sans-serif"] = [_cjk[0]] + matplotlib.rcParams["font.sans-serif"]
    matplotlib.rcParams["axes.unicode_minus"] = False
ZH = bool(_cjk)          # 没有中文字体时只用英文标签，避免出现方框

if MOE["dense"][3]:
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for key, zh, en in (("dense", "稠密写法（每个专家算全部 token）", "dense (every expert, every token)"),
                        ("dispatch", "分发写法（只算选中的 token）", "dispatched (selected tokens only)")):
        tl = MOE[key][3]
        ax.plot([i / (len(tl) - 1) for i in range(len(tl))], [mib(v) for v in tl], label=zh if ZH else en)
    ax.set_xlabel("前向 + 反向的进度（按分配事件归一化）" if ZH else "progress through forward + backward")
    ax.set_ylabel("相对起点的已分配显存 (MiB)" if ZH else "allocated above start (MiB)")
    ax.set_title("MoE 层，T=2048, h=128, E=8, top-2, FP32" if ZH else "MoE layer, T=2048, h=128, E=8, top-2, FP32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()
else:
    print("在 GPU 上没有逐次分配的时间线；看上面的峰值即可。")

# %% [markdown]
# ### 显存低，不等于路由做对了：用 `FlopCounterMode` 数计算量
#
# 把稠密写法改成“按专家循环、每个专家仍处理全部 token”，一次只留一个专家的 $[T, 4h]$，峰值同样很低，但每个专家仍然对全部 token 做了矩阵乘。要区分这两种写法，得数计算量。`torch.utils.flop_counter.FlopCounterMode` 是一个上下文管理器：在 `with FlopCounterMode(display=False) as counter:` 里运行的矩阵乘都会被计数，`counter.get_total_flops()` 返回总数。下面只做前向（推理，和评分练习一样），在 `torch.no_grad()` 下量四种写法的峰值增量和矩阵乘的浮点运算次数，都以稠密写法为 1：
#
# - **按专家循环的稠密写法**：见上；
# - **按容量补齐**：把每个专家的 token 排好序、补齐到同一长度（这里取本批最忙专家的 token 数，不丢 token），放进 $[E, C, h]$ 的缓冲区，用一次批量矩阵乘（`bmm`）算完所有专家。

# %% tags=["moe_flops"]
from torch.utils.flop_counter import FlopCounterMode


def moe_expert_loop(x, router_weight, w_in, w_out, top_k):
    """按专家循环，但每个专家仍算全部 token，再乘门控：一次只留一个专家的 [T, 4h]。"""
    probs, top_v, top_i = route(x, router_weight, top_k)
    gates = torch.zeros_like(probs).scatter(1, top_i, top_v)
    out = torch.zeros_like(x)
    for e in range(w_in.shape[0]):
        out += (F.gelu(x @ w_in[e].T) @ w_out[e].T) * gates[:, e:e + 1]
    return out


def moe_padded(x, router_weight, w_in, w_out, top_k):
    """按专家号给 (token, 第几选) 排序，填进 [E, C, h] 的缓冲区（C = 最忙专家的 token 数），两次 bmm 算完。"""
    probs, top_v, top_i = route(x, router_weight, top_k)
    flat = top_i.flatten()                                   # [T * k]，第 i 项属于 token i // k
    order = flat.argsort(stable=True)
    expert = flat[order]
    counts = torch.bincount(flat, minlength=w_in.shape[0])
    pos = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[expert]
    token = order // top_k
    buf = x.new_zeros(w_in.shape[0], int(counts.max()), x.shape[1])
    buf[expert, pos] = x[token]
    y = torch.bmm(F.gelu(torch.bmm(buf, w_in.transpose(1, 2))), w_out.transpose(1, 2))[expert, pos]
    return torch.zeros_like(x).index_add_(0, token, y * top_v.flatten()[order, None])


def moe_forward_cost(fn):
    """只做前向：峰值增量（字节）、矩阵乘的浮点运算次数、输出。"""
    with vramlab.open_device(BACKEND) as dev:
        g = torch.Generator(device=dev.torch_device).manual_seed(0)
        x = torch.randn(T_MOE, D, generator=g, device=dev.torch_device)
        router = torch.randn(E, D, generator=g, device=dev.torch_device) / D**0.5
        w_in = torch.randn(E, 4 * D, D, generator=g, device=dev.torch_device) / D**0.5
        w_out = torch.randn(E, D, 4 * D, generator=g, device=dev.torch_device) / (4 * D)**0.5
        with torch.no_grad():
            fn(x, router, w_in, w_out, K)                    # 热身
            dev.empty_cache()
            dev.synchronize()
            base = dev.allocated()
            dev.reset_peak()
            with FlopCounterMode(display=False) as counter:
                y = fn(x, router, w_in, w_out, K)
            dev.synchronize()
            return dev.max_allocated() - base, counter.get_total_flops(), y.cpu()


COST = {name: moe_forward_cost(fn) for name, fn in (("稠密写法", moe_dense), ("分发写法", moe_dispatch),
                                                    ("按专家循环的稠密写法", moe_expert_loop),
                                                    ("按容量补齐 + bmm", moe_padded))}
peak0, flops0, y0 = COST["稠密写法"]
print(f"只做前向（torch.no_grad），T = {T_MOE}，h = {D}，E = {E}，top-{K}，FP32；以稠密写法为 1")
print(pad("写法", 24), pad("峰值增量 MiB", 14), pad("峰值", 8), pad("矩阵乘 GFLOP", 14), pad("计算量", 8), "输出最大差")
for name, (peak, flops, y) in COST.items():
    print(pad(name, 24), pad(f"{mib(peak):.2f}", 14), pad(f"{peak / peak0:.3f}", 8), pad(f"{flops / 1e9:.3f}", 14),
          pad(f"{flops / flops0:.3f}", 8), f"{(y - y0).abs().max().item():.1e}")
print(f"k / E = {K / E:.3f}")

# %% [markdown]
# 分发写法的计算量正好是 $k/E$（路由器本身的 $[T, h] \times [h, E]$ 只占很小一部分）；按专家循环的写法峰值也很低，计算量却和稠密写法一样；按容量补齐的写法多算了补齐的那些行。本章的评分练习除了峰值，也用 `FlopCounterMode` 数矩阵乘的计算量，上限是 $1.5 \cdot k/E$：补齐的写法能过，按专家循环的稠密写法过不了。

# %% [markdown]
# ### 容量因子与分发缓冲区
#
# 上面的分发写法不限制每个专家收多少 token（“不丢 token”，dropless）。GShard 和 Switch Transformer 为了让张量形状固定（TPU 上必须如此），给每个专家一个容量（expert capacity）：
#
# $$C = \left\lceil \text{capacity factor} \times \frac{T \cdot k}{E} \right\rceil$$
#
# 超出容量的 token 被丢掉（这一层对它输出 0，只靠残差连接把它传下去），不满的位置补零。于是分发缓冲区是一个 $[E, C, h]$ 的张量；GShard 式的实现（DeepSpeed 的 `sharded_moe.py`）还先建一个 $[T, E, C]$ 的分发掩码，再用 `einsum("sec,sm->ecm")` 把 token 搬进缓冲区。用上面同一个随机路由器数一数：

# %%
with torch.no_grad():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(T_MOE, D, generator=g)
    r0 = torch.randn(E, D, generator=g) / D**0.5
    probs0, _, top_i0 = route(x0, r0, K)
    load = torch.bincount(top_i0.reshape(-1), minlength=E)
print("每个专家收到的 token 数：", load.tolist(), f"（平均 {T_MOE * K // E}）")
publish("load_min", int(load.min()))
publish("load_max", int(load.max()))
publish("load_mean", T_MOE * K // E)
print(pad("容量因子", 10), pad("容量 C", 8), pad("丢弃的 (token, 专家) 对", 24), pad("[E,C,h] 缓冲区 MiB", 20),
      "[T,E,C] FP32 掩码 MiB")
for cf in (1.0, 1.25, 2.0):
    C = math.ceil(cf * T_MOE * K / E)
    dropped = int((load - C).clamp(min=0).sum())
    print(pad(f"{cf}", 10), pad(str(C), 8), pad(f"{dropped}（{dropped / (T_MOE * K):.1%}）", 24),
          pad(f"{mib(E * C * D * 4):.2f}", 20), f"{mib(T_MOE * E * C * 4):.2f}")
    key = f"cf{cf:g}".replace(".", "_")
    publish(f"{key}_capacity", C)
    publish(f"{key}_dropped", dropped)
    publish(f"{key}_dropped_share", dropped / (T_MOE * K), fmt="{:.1%}")
    publish(f"{key}_buffer_mib", mib(E * C * D * 4), fmt="{:.2f}")
    publish(f"{key}_mask_mib", mib(T_MOE * E * C * 4), fmt="{:.2f}")
    publish(f"{key}_mask_over_buffer", (T_MOE * E * C) / (E * C * D), fmt="{:.0f}")
print(f"路由 logits [T, E]：{mib(T_MOE * E * 4):.3f} MiB；一层的隐藏状态 [T, h]：{mib(T_MOE * D * 4):.2f} MiB")
publish("router_logits_mib", mib(T_MOE * E * 4), fmt="{:.3f}")
publish("hidden_mib", mib(T_MOE * D * 4), fmt="{:.2f}")

# %% [markdown]
# 三点值得注意：
#
# - 容量因子 1.0 时，负载最重的专家放不下，丢掉了一部分 token；加到 1.25（Switch Transformer 的常用值之一）或 2.0 丢得少了，缓冲区按比例变大，而且不满的位置也占显存。
# - $[T, E, C]$ 掩码的元素个数是 $T \cdot E \cdot C = \text{cf} \cdot k \cdot T^2$，随 token 数**平方**增长：这里它已经是 $[E, C, h]$ 缓冲区的 16 倍。这是 einsum 式分发在长序列、大批次时的隐患；按下标收集（本节的 `nonzero` + `index_add_`，或 Megatron 的 token permutation）没有这块。
# - 路由 logits 只有 $T \times E$，和隐藏状态比很小；HF 的 Mixtral 在 `output_router_logits=True` 时把每一层的 logits 都留下来算负载均衡损失，也只是 $L \times T \times E$。
#
# 负载均衡辅助损失（Switch Transformer）是 $\alpha \cdot E \cdot \sum_i f_i P_i$：$f_i$ 是分给专家 $i$ 的 token 比例，$P_i$ 是路由概率在专家 $i$ 上的平均值。完全均匀时 $E \sum_i f_i P_i = 1$：

# %%
f_i = load.float() / load.sum()
P_i = probs0.mean(dim=0)
print(f"E · Σ f_i·P_i = {E * float((f_i * P_i).sum()):.4f}（均匀路由时为 1，越不均衡越大）")
publish("aux_balance", E * float((f_i * P_i).sum()), fmt="{:.4f}")

# %% [markdown]
# ## 5. 专家并行：2 个 gloo 进程，all-to-all 交换 token
#
# 专家并行（expert parallelism）把 $E$ 个专家分给 $N$ 个 rank，每个 rank 只存 $E/N$ 个专家的权重（以及它们的梯度和优化器状态）。每个 rank 处理自己的一批 token：
#
# 1. 路由器（每个 rank 一份）算出每个 token 的 top-$k$ 专家；
# 2. 按目标专家排序，把要发给每个 rank 的行数先用一次 `all_to_all_single` 告诉对方；
# 3. **分发**（dispatch）：`all_to_all_single` 按这些行数把 token 发出去；
# 4. 每个 rank 用本地专家算收到的 token；
# 5. **合并**（combine）：再一次 all-to-all 把结果发回 token 原来的 rank，乘门控权重、按下标加回。
#
# gloo 后端在 CPU 上支持 `all_to_all_single`，包括每个 rank 收发行数不等的情况（`output_split_sizes` / `input_split_sizes`）；但列表形式的 `all_to_all` 在 gloo 上要求各块大小相同（本机 torch 2.13 的实测），所以这里只用 `all_to_all_single`。反向传播要把梯度沿原路送回，所以包一个 autograd 函数：前向是一次 all-to-all，反向是收发行数互换的另一次 all-to-all（DeepSpeed 的 `_AllToAll` 也是这样写的）。
#
# 为了核对结果，每个 rank 用同一个种子生成**全部** $E$ 个专家和两个 rank 的 token，在本地算一遍单进程的参考答案，然后专家并行只保留自己那一半专家。进程用 `fork` 启动（Linux；notebook 里定义的函数不能用 `spawn` 传给子进程）。

# %%
EP_E, EP_D, EP_T, EP_K = 4, 64, 512, 2


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


def ep_forward(x, router_weight, w_in_local, w_out_local, top_k, rank, world):
    """专家并行的 MoE 前向：本 rank 只有 w_in_local / w_out_local（E/world 个专家）。"""
    e_local = w_in_local.shape[0]
    _, top_v, top_i = route(x, router_weight, top_k)
    flat_e = top_i.reshape(-1)                                # [T·k]
    order = flat_e.argsort(stable=True)                       # 按专家排序，也就按目标 rank 排好了
    tok = order // top_k
    send_x, send_e = x[tok], flat_e[order]                    # 发送缓冲区：T·k 行
    in_splits = torch.bincount(send_e // e_local, minlength=world)
    out_splits = torch.empty_like(in_splits)
    dist.all_to_all_single(out_splits, in_splits)             # 先告诉对方要收几行
    in_splits, out_splits = in_splits.tolist(), out_splits.tolist()
    recv_x = AllToAll.apply(send_x, out_splits, in_splits)    # 分发
    recv_e = send_e.new_empty(sum(out_splits))
    dist.all_to_all_single(recv_e, send_e, out_splits, in_splits)
    recv_y = torch.zeros_like(recv_x)
    for j in range(e_local):
        idx = (recv_e == rank * e_local + j).nonzero(as_tuple=True)[0]
        h = F.gelu(recv_x[idx] @ w_in_local[j].T) @ w_out_local[j].T
        recv_y = recv_y.index_copy(0, idx, h)
    back = AllToAll.apply(recv_y, in_splits, out_splits)      # 合并：发回原 rank
    w = top_v.reshape(-1)[order]
    out = torch.zeros_like(x).index_add(0, tok, back * w[:, None])
    return out, dict(send_rows=len(order), recv_rows=sum(out_splits), splits=in_splits)


def make_problem():
    g = torch.Generator().manual_seed(42)
    xs = [torch.randn(EP_T, EP_D, generator=g) for _ in range(2)]       # 两个 rank 各自的 token
    router = torch.randn(EP_E, EP_D, generator=g) / EP_D**0.5
    w_in = torch.randn(EP_E, 4 * EP_D, EP_D, generator=g) / EP_D**0.5
    w_out = torch.randn(EP_E, EP_D, 4 * EP_D, generator=g) / (4 * EP_D)**0.5
    return xs, router, w_in, w_out


def storage_bytes(*tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def ep_worker(rank, world, port, queue):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        xs, router, w_in, w_out = make_problem()
        # 参考答案：单进程、全部专家、两个 rank 的 token 拼在一起（损失 = 各 rank 损失之和）
        ref_w = [w_in.clone().requires_grad_(), w_out.clone().requires_grad_()]
        ref = moe_dispatch(torch.cat(xs), router, ref_w[0], ref_w[1], EP_K)
        ref.square().sum().backward()
        # 专家并行：只留本 rank 的 E/world 个专家
        e_local = EP_E // world
        sl = slice(rank * e_local, (rank + 1) * e_local)
        w_in_l = w_in[sl].clone().requires_grad_()
        w_out_l = w_out[sl].clone().requires_grad_()
        out, info = ep_forward(xs[rank], router, w_in_l, w_out_l, EP_K, rank, world)
        out.square().sum().backward()              # 两个 rank 同时反向：AllToAll 的反向是集合通信
        ref_out = ref[rank * EP_T:(rank + 1) * EP_T]
        queue.put((rank, dict(
            out_ok=bool(torch.allclose(out, ref_out, atol=1e-5)),
            grad_ok=bool(torch.allclose(w_in_l.grad, ref_w[0].grad[sl], atol=1e-4)
                         and torch.allclose(w_out_l.grad, ref_w[1].grad[sl], atol=1e-4)),
            dp_expert_bytes=storage_bytes(w_in, w_out), ep_expert_bytes=storage_bytes(w_in_l, w_out_l),
            router_bytes=storage_bytes(router), **info)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


ctx = mp.get_context("fork")
queue = ctx.SimpleQueue()
pc = mp.start_processes(ep_worker, args=(2, free_port(), queue), nprocs=2, start_method="fork", join=False)
EP = dict(queue.get() for _ in range(2))
pc.join()

print(f"E = {EP_E} 个专家，h = {EP_D}，每个 rank {EP_T} 个 token，top-{EP_K}，FP32，2 个 gloo 进程")
print(pad("rank", 5), pad("输出=参考", 10), pad("专家梯度=参考", 14), pad("发给 rank0/1 的行", 18),
      pad("发出行", 7), pad("收到行", 7), pad("数据并行专家权重 MiB", 21), "专家并行专家权重 MiB")
for rank in (0, 1):
    r = EP[rank]
    print(pad(str(rank), 5), pad(str(r["out_ok"]), 10), pad(str(r["grad_ok"]), 14), pad(str(r["splits"]), 18),
          pad(str(r["send_rows"]), 7), pad(str(r["recv_rows"]), 7), pad(f"{mib(r['dp_expert_bytes']):.3f}", 21),
          f"{mib(r['ep_expert_bytes']):.3f}")
for rank in (0, 1):
    publish(f"ep_rank{rank}_recv_rows", EP[rank]["recv_rows"])
    publish(f"ep_rank{rank}_ok", "一致" if EP[rank]["out_ok"] and EP[rank]["grad_ok"] else "不一致")
publish("ep_dp_expert_mib", mib(EP[0]["dp_expert_bytes"]), fmt="{:.3f}")
publish("ep_ep_expert_mib", mib(EP[0]["ep_expert_bytes"]), fmt="{:.3f}")
r = EP[0]
print(f"\n路由器每个 rank 一份：{r['router_bytes']:,} 字节。"
      f"加上梯度和 AdamW 的两个状态（FP32 每参数 16 字节），专家部分每个 rank 从 "
      f"{mib(4 * r['dp_expert_bytes']):.2f} MiB 降到 {mib(4 * r['ep_expert_bytes']):.2f} MiB")

# %% [markdown]
# 两个 rank 的输出和本地专家的梯度都与单进程参考一致：专家并行只是换了个地方算，数学上是同一个 MoE 层。每个 rank 的专家权重正好减半。代价有两处：
#
# - **通信**：每层前向两次 all-to-all（分发、合并），反向再两次。每个 rank 发出的行数是 $T \cdot k$，这些行里发给别的 rank 的部分要走网络。
# - **缓冲区**：发送缓冲区是 $T \cdot k$ 行，接收缓冲区的行数取决于路由，负载不均时某个 rank 收得多。表里两个 rank 收到的行数并不相等，这就是为什么负载均衡在专家并行里同时关系到显存和速度。
