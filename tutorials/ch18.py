# %% [markdown]
# # 第 18 章 动手实践：归一化层存了什么、能省多少
#
# 这份教程配合[第 18 章 Layer Normalization 优化](ch18.md)。我们用 `vramlab` 回答四个问题：
#
# 1. LayerNorm 和 RMSNorm 各有多少参数？在整个模型里占多少？
# 2. 一个归一化层（$h = 4096$，4096 个 token）在前向时给反向留下了什么？手写的逐元素版本、PyTorch 的 `F.layer_norm` / `F.rms_norm`、自己写的 `torch.autograd.Function`、“存输出不存输入”的省显存版本，峰值各是多少？开了 BF16 autocast 又如何？
# 3. Pre-Norm 与 Post-Norm 的 block 保存的张量有什么不同？省显存的归一化在两种排列里各省多少？
# 4. 在真实的小模型里（`tiny` GPT-2 用 LayerNorm，`llama-tiny` 用 RMSNorm），归一化层保存的张量占多大比例？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 2、3 节的大张量在模拟设备上用 FakeTensorMode（只有形状、没有数据）统计，几秒就能跑完；数值正确性用小张量真算一遍。

# %%
import collections
import datetime
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, get_preset
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

transformers.logging.set_verbosity_error()
ON_GPU = banner(f"transformers {transformers.__version__}")
FAKE = not ON_GPU           # 模拟设备上用 FakeTensorMode；真卡上用真实张量
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 两个公式，两种参数量
#
# 对一个 token 的隐藏向量 $x \in \mathbb{R}^h$：
#
# - LayerNorm（Ba 等人，2016）：$\mu = \frac{1}{h}\sum_i x_i$，$\sigma^2 = \frac{1}{h}\sum_i (x_i-\mu)^2$，$y = \gamma \odot \frac{x-\mu}{\sqrt{\sigma^2+\epsilon}} + \beta$。可学习参数 $\gamma, \beta$ 共 $2h$ 个。
# - RMSNorm（Zhang 与 Sennrich，2019）：$\mathrm{rms} = \sqrt{\frac{1}{h}\sum_i x_i^2 + \epsilon}$，$y = \gamma \odot \frac{x}{\mathrm{rms}}$。不减均值、没有偏置，参数只有 $\gamma$，共 $h$ 个。
#
# 下面在 meta 设备上（不占内存）建出几个模型，数一数归一化层的参数。

# %%
def norm_params(name):
    model = build_model(name, device=torch.device("meta"))
    total = sum(p.numel() for p in model.parameters())
    norms = [m for m in model.modules() if "Norm" in type(m).__name__]
    n = sum(p.numel() for m in norms for p in m.parameters(recurse=False))
    return type(norms[0]).__name__, len(norms), n, total


print(pad("模型", 14), pad("归一化层类型", 16), pad("层数", 6), pad("归一化参数", 12), pad("总参数", 16), "占比")
for name in ["gpt2-small", "gpt2-medium", "llama-1b", "llama-7b"]:
    kind, count, n, total = norm_params(name)
    print(pad(name, 14), pad(kind, 16), pad(str(count), 6), pad(f"{n:,}", 12), pad(f"{total:,}", 16), f"{n / total:.4%}")
    key = name.replace("-", "_")
    publish(f"norm_{key}_share", n / total, fmt="{:.4%}")
    publish(f"norm_{key}_count", count)
    publish(f"norm_{key}_params", f"{n:,}")
    if name == "gpt2-small":
        publish("norm_gpt2_small_share_short", n / total, fmt="{:.2%}")

# %% [markdown]
# 每个 block 两个归一化层，再加上最后的一个（`ln_f` / `norm`）：GPT-2 small 是 $25 \times 2 \times 768 = 38{,}400$ 个参数，Llama-2-7B 形状是 $65 \times 4096 = 266{,}240$ 个。归一化层的参数在模型状态里可以忽略不计，**它们的显存账在激活值上**：每个归一化层都要为反向保存一个和隐藏状态一样大的张量。下面就来数这一笔。

# %% [markdown]
# ## 2. 一个归一化层：保存了什么，峰值多少
#
# 取 $h = 4096$、4096 个 token（例如批大小 1、序列长度 4096），一个 $[4096, 4096]$ 的 FP32 张量是 64 MiB，记作 **1 个单位**。我们比较下面几种写法：
#
# | 写法 | 说明 |
# |---|---|
# | 手写 LayerNorm | `x.mean`、`x - mean`、`pow(2).mean`、`rsqrt`、乘 $\gamma$ 加 $\beta$，每一步都是一个独立的 PyTorch 算子 |
# | `F.layer_norm` | PyTorch 原生的融合内核 `native_layer_norm`：只存输入、每行的均值和 rstd（标准差的倒数） |
# | 手写 RMSNorm | 本章评分练习的起始代码：`x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight` |
# | `F.rms_norm` | torch 2.4 起提供；在 CPU（也就是模拟设备）上它拆成和手写版一样的逐元素算子，在 CUDA 上 torch 2.13 调用融合内核 `_fused_rms_norm`（见正文） |
# | `RMSNormFn` | 自己写的 `torch.autograd.Function`：前向只存 `x` 和每行的 `rstd`，反向按公式手算梯度 |
# | `MemEffRMSNormFn` | 省显存变体：存**输出** $y$ 和 `rstd`，反向用 $\hat x = y / \gamma$ 还原（apex 的 `memory_efficient=True` 就是这个思路） |
#
# 先把这几个函数写出来。`RMSNormFn` 的反向公式：记 $\hat x = x \cdot r$（$r$ 即 rstd），$g = \frac{\partial L}{\partial y} \odot \gamma$，则 $\frac{\partial L}{\partial x} = r\left(g - \hat x \cdot \overline{g \odot \hat x}\right)$（上划线表示沿隐藏维求平均），$\frac{\partial L}{\partial \gamma} = \sum_{\text{token}} \frac{\partial L}{\partial y} \odot \hat x$。反向里尽量用原地操作，少造几个 1 个单位大小的临时张量。

# %%
EPS = 1e-6


def eager_layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    rstd = torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    return xc * rstd * w + b


def eager_rms_norm(x, w, eps=EPS):          # 评分练习的起始代码就是这一行
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def hf_rms_norm(x, w, eps=EPS):             # transformers 的 LlamaRMSNorm.forward 的写法
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def _rms_backward(gy, xhat, w, rstd):
    """已知 xhat = x * rstd，返回 (dx, dw)；xhat 会被原地改写。"""
    gx = gy * w                                          # 先当作 g，最后变成 dx
    c = (gx * xhat).mean(-1, keepdim=True)               # 每行一个数
    gx.addcmul_(xhat, c, value=-1).mul_(rstd)            # dx = rstd * (g - xhat * c)
    gw = xhat.mul_(gy).sum(0)                            # xhat 用完了，原地复用
    return gx, gw


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)   # [tokens, 1]
        ctx.save_for_backward(x, w, rstd)                # 只存输入和每行一个数
        return x * rstd * w

    @staticmethod
    def backward(ctx, gy):
        x, w, rstd = ctx.saved_tensors
        gx, gw = _rms_backward(gy, x * rstd, w, rstd)
        return gx, gw, None


class MemEffRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        y = x * rstd * w
        ctx.save_for_backward(y, w, rstd)                # 存输出：它反正要交给下一层保存
        return y

    @staticmethod
    def backward(ctx, gy):
        y, w, rstd = ctx.saved_tensors
        gx, gw = _rms_backward(gy, y / w, w, rstd)       # 从输出还原 xhat（要求 γ 不为 0）
        return gx, gw, None


# 先用小张量真算一遍，确认几种写法的输出和梯度一致
torch.manual_seed(0)
xs = torch.randn(64, 256, dtype=torch.float64, requires_grad=True)
ws = (1 + 0.1 * torch.randn(256, dtype=torch.float64)).requires_grad_()
ref_y = eager_rms_norm(xs, ws)
ref_g = torch.autograd.grad(ref_y, (xs, ws), torch.ones_like(ref_y) + xs.detach())
print(pad("写法", 20), pad("输出最大差", 12), "梯度最大差（x, γ）")
for label, fn in [("F.rms_norm", lambda x, w: F.rms_norm(x, (256,), w, EPS)),
                  ("RMSNormFn", lambda x, w: RMSNormFn.apply(x, w, EPS)),
                  ("MemEffRMSNormFn", lambda x, w: MemEffRMSNormFn.apply(x, w, EPS))]:
    y = fn(xs, ws)
    g = torch.autograd.grad(y, (xs, ws), torch.ones_like(y) + xs.detach())
    print(pad(label, 20), pad(f"{(y - ref_y).abs().max().item():.1e}", 12),
          f"{(g[0] - ref_g[0]).abs().max().item():.1e}, {(g[1] - ref_g[1]).abs().max().item():.1e}")
gx_err = max((torch.autograd.grad(RMSNormFn.apply(xs, ws, EPS), (xs,), torch.ones_like(ref_y) + xs.detach())[0]
              - ref_g[0]).abs().max().item(), 0.0)
mant, exp = f"{gx_err:.1e}".split("e")
publish("fn_grad_err", f"{mant} \\times 10^{{{int(exp)}}}")
print("gradcheck(RMSNormFn)：",
      torch.autograd.gradcheck(lambda x, w: RMSNormFn.apply(x, w, EPS), (xs[:4, :16], ws[:16])))

# %% [markdown]
# 三种写法与手写公式的差都在 FP64 的舍入误差量级，`gradcheck` 也通过了。现在到模拟设备上测显存。每种写法都做一次“前向 + 反向”：输入 `x` 和上游梯度 `gy` 事先建好（不计入），记录
#
# - **保存（MiB）**：`saved_tensors_hooks` 看到的、除输入 `x` 和参数之外的张量，按存储去重；
# - **前向后（MiB）**：前向结束时比开始多占的显存（输出 + 保存的张量）；
# - **峰值（MiB）**：前向 + 反向期间比开始多出的最高值（输出 `y` 一直由调用者拿着，就像真实网络里下一层拿着它一样）。

# %% tags=["one_norm"]
N = H = 4096
UNIT = N * H * 4            # 1 个单位 = 一个 [4096, 4096] 的 FP32 张量 = 64 MiB


def measure_norm(fn, dtype=torch.float32, autocast=False):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        x = torch.randn(N, H, device=dev.torch_device, dtype=dtype, requires_grad=True)
        w = torch.ones(H, device=dev.torch_device, requires_grad=True)
        b = torch.zeros(H, device=dev.torch_device, requires_grad=True)
        gy = torch.randn(N, H, device=dev.torch_device, dtype=torch.float32)
        skip = {t.untyped_storage()._cdata for t in (x, w, b)}
        saved = {}

        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in skip:
                saved[st._cdata] = st.nbytes()
            return t

        base = dev.allocated()
        dev.reset_peak()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                with torch.autocast(dev.type, torch.bfloat16, enabled=autocast):
                    y = fn(x, w, b)
        after_fwd = dev.allocated() - base
        y.backward(gy.to(y.dtype))
        peak = dev.max_allocated() - base
        return dict(saved=sum(saved.values()), fwd=after_fwd, peak=peak, out=str(y.dtype).removeprefix("torch."),
                    warn=[str(c.message).split(".")[0] for c in caught if "fused" in str(c.message)])


CASES = [
    ("手写 LayerNorm", lambda x, w, b: eager_layer_norm(x, w, b)),
    ("F.layer_norm", lambda x, w, b: F.layer_norm(x, (H,), w, b)),
    ("手写 RMSNorm（起始代码）", lambda x, w, b: eager_rms_norm(x, w)),
    ("F.rms_norm", lambda x, w, b: F.rms_norm(x, (H,), w, EPS)),
    ("RMSNormFn", lambda x, w, b: RMSNormFn.apply(x, w, EPS)),
    ("MemEffRMSNormFn", lambda x, w, b: MemEffRMSNormFn.apply(x, w, EPS)),
]
fp32 = {label: measure_norm(fn) for label, fn in CASES}


def show(results, ref):
    print(pad("写法", 28), pad("保存 MiB", 10), pad("单位", 6), pad("前向后 MiB", 12), pad("峰值 MiB", 10),
          pad("峰值 / 参照", 12), "输出 dtype")
    for label, r in results.items():
        print(pad(label, 28), pad(f"{mib(r['saved']):.1f}", 10), pad(f"{r['saved'] / UNIT:.2f}", 6),
              pad(f"{mib(r['fwd']):.1f}", 12), pad(f"{mib(r['peak']):.1f}", 10),
              pad(f"{r['peak'] / results[ref]['peak']:.2f}", 12), r["out"])


show(fp32, "手写 RMSNorm（起始代码）")
KEYS = {"手写 LayerNorm": "eager_ln", "F.layer_norm": "f_ln", "手写 RMSNorm（起始代码）": "eager_rms", "F.rms_norm": "f_rms",
        "RMSNormFn": "fn_rms", "MemEffRMSNormFn": "memeff_rms", "LlamaRMSNorm 写法": "hf_rms"}


def publish_norms(results, tag, ref):
    for label, r in results.items():
        key = f"{tag}_{KEYS[label]}"
        publish(f"{key}_saved_mib", mib(r["saved"]), fmt="{:.1f}")
        publish(f"{key}_fwd_mib", mib(r["fwd"]), fmt="{:.1f}")
        publish(f"{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
        publish(f"{key}_peak_ratio", r["peak"] / results[ref]["peak"], fmt="{:.2f}")


publish_norms(fp32, "fp32", "手写 RMSNorm（起始代码）")

# %% [markdown]
# 逐行读（FP32，1 个单位 = 64 MiB）：
#
# - **手写 LayerNorm** 保存了 2 个单位：`x - mean`（`pow` 和后面的乘法都要用它）和归一化后的 $\hat x$（乘 $\gamma$ 要用它）。反向时这些逐元素算子又各自造出 1 个单位大小的梯度，峰值是 `F.layer_norm` 的好几倍。
# - **`F.layer_norm`** 只多存了每行的均值和 rstd（$2 \times 4096 \times 4$ 字节 = 32 KiB，表里显示为 0.0 MiB）；输入 `x` 本来就在。前向后只多出输出这 1 个单位，反向的融合内核一次算出 $\partial L/\partial x$，峰值约 2 个单位（输出和输入梯度）。
# - **手写 RMSNorm** 和 **`F.rms_norm`** 在模拟设备上完全一样：CPU 上的 `F.rms_norm` 就是拆成同样几个算子的组合实现，多存了 $\hat x$ 这 1 个单位。在 CUDA 上（torch 2.13）`F.rms_norm` 会走融合内核，那一行会接近 `F.layer_norm`；有 GPU 时重跑这个 notebook 就能看到。
# - **`RMSNormFn`** 前向只存 `x` 和 rstd，前向后和 `F.layer_norm` 一样只多 1 个单位；反向用 Python 写，要临时造出 $\hat x$、$g$ 和一个乘积，峰值比融合内核高，但比起始代码低。
# - **`MemEffRMSNormFn`** 存的是输出 $y$。单看这一层它和 `RMSNormFn` 一样；它的好处要放进网络里才看得出来：$y$ 反正会被下一个线性层保存，而输入 $x$ 就可以不再被任何人引用（见第 3 节）。

# %% [markdown]
# ### 开了 BF16 autocast 之后
#
# 混合精度训练里（[第 6 章](ch06.md)），输入常常是 BF16。CUDA 的 autocast 把 `layer_norm` 列为“在 FP32 中运行”的算子：BF16 的输入先被转成 FP32 再交给内核，于是**保存下来的是那份 FP32 副本**，输出也是 FP32。`rms_norm` 不在这张表里；BF16 输入配 FP32 的 $\gamma$ 时，`F.rms_norm` 会警告“dtype 不一致，不能走融合实现”，退回组合实现。下面的 `x` 是 BF16（每个元素 2 字节，所以 1 个单位的 FP32 张量相当于 2 份 BF16）。

# %%
bf16 = {label: measure_norm(fn, dtype=torch.bfloat16, autocast=True) for label, fn in [
    ("F.layer_norm", lambda x, w, b: F.layer_norm(x, (H,), w, b)),
    ("手写 RMSNorm（起始代码）", lambda x, w, b: eager_rms_norm(x, w)),
    ("LlamaRMSNorm 写法", lambda x, w, b: hf_rms_norm(x, w)),
    ("F.rms_norm", lambda x, w, b: F.rms_norm(x, (H,), w, EPS)),
]}
show(bf16, "手写 RMSNorm（起始代码）")
print("\nF.rms_norm 的警告：", bf16["F.rms_norm"]["warn"] or "（无）")
publish_norms(bf16, "bf16", "手写 RMSNorm（起始代码）")

# %% [markdown]
# `F.layer_norm` 在 autocast 下保存了 1 个单位（64 MiB）：正是 BF16 输入被转成的 FP32 副本，比 BF16 输入本身（32 MiB）大一倍。Korthikanti 等人估算激活值时假设两个 LayerNorm 的输入都按 2 字节保存（每层 $4sbh$ 字节），在 PyTorch autocast 下它们实际按 4 字节保存。`LlamaRMSNorm` 的写法先 `.to(torch.float32)`，保存了这份 FP32 副本（1 个单位）和转回 BF16 的 $\hat x$（0.5 个单位）；起始代码和 `F.rms_norm` 各存了 2 个单位（`pow` 在 autocast 下按 FP32 运行，存下 FP32 副本；`x * rstd` 按类型提升得到 FP32 的 $\hat x$）。警告说明 `F.rms_norm` 在这种 dtype 组合下走不了融合内核。

# %% [markdown]
# ## 3. Pre-Norm 与 Post-Norm：保存的张量有什么不同
#
# 两种排列（$F$ 是注意力或 MLP 子层）：
#
# - Post-Norm（原始 Transformer、BERT）：$x_{l+1} = \mathrm{LN}(x_l + F(x_l))$
# - Pre-Norm（GPT-2 及以后的大多数 LLM）：$x_{l+1} = x_l + F(\mathrm{LN}(x_l))$
#
# 下面搭一个简化的 block（SDPA 注意力 + GELU MLP，两个 LayerNorm），$h = 4096$、序列长度 4096、2 个 block，分别用 Pre-Norm 和 Post-Norm 排列，归一化层用 `F.layer_norm` 或“存输出”的省显存版本 `MemEffLayerNormFn`（apex `FusedLayerNorm(memory_efficient=True)` 的做法：前向存 $y$ 和 rstd，反向用 $\hat x = (y-\beta)/\gamma$ 还原）。统计的是每个 block 保存的激活值（不含输入和参数，按存储去重；autocast 为线性层缓存的 BF16 权重副本单独列出，它们不是激活值，见[第 6 章](ch06.md)），以及 3 个 block 前向 + 反向的峰值。

# %%
class MemEffLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps):
        y, _, rstd = torch.native_layer_norm(x, (x.shape[-1],), w, b, eps)
        ctx.save_for_backward(y, w, b, rstd)             # 不存输入 x，也不存均值
        return y

    @staticmethod
    def backward(ctx, gy):
        y, w, b, rstd = ctx.saved_tensors
        xhat = (y - b) / w                               # 从输出还原（要求 γ 不为 0）
        g = gy * w
        gx = g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)
        return gx * rstd, (gy * xhat).sum(tuple(range(gy.dim() - 1))), gy.sum(tuple(range(gy.dim() - 1))), None


class Norm(nn.LayerNorm):
    mem_eff = False

    def forward(self, x):
        if self.mem_eff:
            return MemEffLayerNormFn.apply(x, self.weight, self.bias, self.eps)
        return super().forward(x)


class Block(nn.Module):
    def __init__(self, h, pre_norm, heads=32):
        super().__init__()
        self.pre_norm, self.heads = pre_norm, heads
        self.ln1, self.ln2 = Norm(h), Norm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def attn(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, h))

    def mlp(self, x):
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


VIEW_OPS = ("TBackward", "TransposeBackward", "ViewBackward", "PermuteBackward", "ExpandBackward", "UnsafeViewBackward")


def is_weight_copy(t):
    """autocast 为线性层缓存的低精度权重副本：由参数经 .to() 得来（可能再转置一下）。"""
    gf = t.grad_fn
    while gf is not None and gf.name().startswith(VIEW_OPS):
        gf = gf.next_functions[0][0]
    return (gf is not None and gf.name().startswith("ToCopyBackward")
            and any(n is not None and n.name().endswith("AccumulateGrad") for n, _ in gf.next_functions))


def measure_blocks(pre_norm, mem_eff, autocast=False, layers=2, seq=4096):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        blocks = nn.Sequential(*[Block(H, pre_norm) for _ in range(layers)]).to(dev.torch_device)
        for m in blocks.modules():
            if isinstance(m, Norm):
                m.mem_eff = mem_eff
        x = torch.randn(1, seq, H, device=dev.torch_device, requires_grad=True)
        skip = {p.untyped_storage()._cdata for p in blocks.parameters()} | {x.untyped_storage()._cdata}
        saved, copies = {}, {}

        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in skip:
                (copies if is_weight_copy(t) else saved)[st._cdata] = st.nbytes()
            return t

        base = dev.allocated()
        dev.reset_peak()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(dev.type, torch.bfloat16, enabled=autocast):
                y = blocks(x)
        y.float().sum().backward()
        return dict(saved=sum(saved.values()), copies=sum(copies.values()), peak=dev.max_allocated() - base)


# 边界效应（第一个 block 的输入、最后一个 block 的输出）会让“总数 / block 数”不准，
# 所以分别测 2 个和 3 个 block，取差值：这就是稳态下每多一个 block 多保存的量。
print(pad("排列", 10), pad("归一化", 20), pad("精度", 15), pad("激活值/block", 14), pad("权重副本/block", 16),
      "3 个 block 的峰值 MiB")
blocks_result = {}
for autocast in (False, True):
    for pre in (True, False):
        for mem_eff in (False, True):
            r2, r3 = (measure_blocks(pre, mem_eff, autocast, layers=n) for n in (2, 3))
            per_block = (r3["saved"] - r2["saved"]) / UNIT
            copies = (r3["copies"] - r2["copies"]) / UNIT
            blocks_result[(pre, mem_eff, autocast)] = (per_block, r3["peak"])
            key = f"{'pre' if pre else 'post'}_{'memeff' if mem_eff else 'ln'}_{'bf16' if autocast else 'fp32'}"
            publish(f"block_{key}_units", per_block, fmt="{:.2f}")
            publish(f"block_{key}_peak_mib", mib(r3["peak"]), fmt="{:.1f}")
            publish(f"block_{key}_copies", copies, fmt="{:.0f}")
            print(pad("Pre-Norm" if pre else "Post-Norm", 10), pad("MemEffLayerNormFn" if mem_eff else "F.layer_norm", 20),
                  pad("BF16 autocast" if autocast else "FP32", 15), pad(f"{per_block:.2f} 单位", 14),
                  pad(f"{copies:.2f} 单位", 16), f"{mib(r3['peak']):.1f}")
publish("block_pre_bf16_memeff_extra_mib", mib(blocks_result[(True, True, True)][1] - blocks_result[(True, False, True)][1]),
        fmt="{:.0f}")
publish("block_fp32_memeff_saving", blocks_result[(True, False, False)][0] - blocks_result[(True, True, False)][0], fmt="{:.0f}")

# %% [markdown]
# FP32 下，Pre-Norm 和 Post-Norm 每个 block 保存的激活值**完全相同**（16 个单位）：两种排列里，每个归一化层都存一份自己的输入（1 个单位），它的输出又被下一个线性层当作输入存一份。区别只在于存的是**哪个**张量：Pre-Norm 的归一化层存的是残差流 $x_l$ 本身（它不经过归一化，幅度随层数增长），Post-Norm 存的是残差和 $x_l + F(x_l)$，归一化后的输出才是残差流。
#
# 换成“存输出”的省显存版本，两种排列每个 block 都少存 2 个单位，也就是两个归一化层的输入（Korthikanti 公式里的 $4sbh$ 那一项）全部消失：输出反正被下一个线性层存着，两者是同一块存储；Pre-Norm 里的残差流 $x_l$ 做完残差加法后不再被任何人引用，直接释放。
#
# BF16 autocast 下情况变了。每个 block 的激活值是 9 个单位（另有 6 个单位是 autocast 缓存的 BF16 权重副本：4 个线性层共 $12h^2$ 个参数，每个 2 字节，$24h^2$ 字节 = 6 个单位，算术），而省显存版本**一点也没省**：归一化层的输出是 FP32，下一个线性层存的却是它转成的 BF16 副本，两者不再是同一块存储；省显存版本存 FP32 的输出，原版存 FP32 的输入（残差流在 autocast 下也是 FP32：FP32 的输入加上 BF16 的子层输出，按类型提升得到 FP32），一换一。Pre-Norm 那一行的峰值还高了 128 MiB，因为用 Python 写的反向比融合内核多造了几个临时张量。要在混合精度下也省掉这一项，归一化核得直接输出低精度、并让下一层共用同一块存储，这只能在内核层面做（例如把归一化和后面的线性层融合成一个模块）。

# %% [markdown]
# ## 4. 真实模型里：GPT-2 的 LayerNorm 与 Llama 的 RMSNorm
#
# 最后在两个 2 层的小模型上（`tiny`：GPT-2 结构，`nn.LayerNorm`；`llama-tiny`：Llama 结构，`LlamaRMSNorm`；隐藏维度都是 128），用和[第 7 章](ch07.md)一样的办法，按模块统计每个保存的张量记在哪个子模块名下。批大小 8，序列长度 256，真实张量。

# %%
def saved_by_module(name, autocast=False, b=8, s=256):
    cfg = get_preset(name).config
    h = cfg.get("n_embd", cfg.get("hidden_size"))
    with vramlab.open_device("auto") as dev:
        model = build_model(name, device=dev.torch_device)
        model.train()
        ids = torch.randint(0, 1024, (b, s), generator=torch.Generator().manual_seed(0)).to(dev.torch_device)
        names = {id(m): n for n, m in model.named_modules()}
        stack, handles = [], []
        def enter(module, args):
            stack.append(names[id(module)])

        def leave(module, args, output):
            stack.pop()

        for m in model.modules():
            handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        first = {}

        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in params and st._cdata not in first:
                first[st._cdata] = (stack[-1] if stack else "", st.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast(dev.type, torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for hnd in handles:
            hnd.remove()
    unit = b * s * h * 4
    norm_bytes = sum(n for where, n in first.values() if where.split(".")[-1].endswith(("ln_1", "ln_2", "ln_f"))
                     or "layernorm" in where or where.endswith(".norm") or where == "model.norm")
    total = sum(n for _, n in first.values())
    return norm_bytes / unit, total / unit


print(pad("模型", 12), pad("归一化层", 14), pad("精度", 16), pad("归一化层保存（单位）", 22), pad("全部保存（单位）", 18), "占比")
for name, kind in [("tiny", "LayerNorm"), ("llama-tiny", "RMSNorm")]:
    for autocast in (False, True):
        nb, tot = saved_by_module(name, autocast)
        print(pad(name, 12), pad(kind, 14), pad("BF16 autocast" if autocast else "FP32", 16), pad(f"{nb:.2f}", 22),
              pad(f"{tot:.2f}", 18), f"{nb / tot:.1%}")
        key = f"{name.replace('-', '_')}_{'bf16' if autocast else 'fp32'}"
        publish(f"model_{key}_norm_units", nb, fmt="{:.2f}")
        publish(f"model_{key}_share", nb / tot, fmt="{:.1%}")

# %% [markdown]
# 这里 1 个单位是一个 $[8, 256, 128]$ 的 FP32 张量（1 MiB），每个模型有 5 个归一化层（每个 block 2 个，外加最后 1 个）。GPT-2 的 `nn.LayerNorm` 走的是融合内核，每层只存输入（1 个单位）和两个很小的统计量，5 层约 5 个单位。Llama 的 `LlamaRMSNorm` 是逐元素算子拼出来的，每层除了输入还存一份 $\hat x$，5 层约 10 个单位，是 LayerNorm 的两倍：RMSNorm 在公式上省掉的均值，被 eager 实现多存的中间结果抵消了。BF16 autocast 下，两者归一化层保存的字节数都不变（残差流本来就是 FP32，`LlamaRMSNorm` 又显式转成 FP32 计算），而线性层、注意力存的张量变成了 BF16，所以归一化层的占比反而更高。
#
# 把第 2 节的数字画成图：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")},
             key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

labels = list(fp32)
fig, ax = plt.subplots(figsize=(9, 3.6))
ys = range(len(labels))
ax.barh([y + 0.2 for y in ys], [mib(fp32[k]["peak"]) for k in labels], height=0.4, label="前向 + 反向峰值 (peak)")
ax.barh([y - 0.2 for y in ys], [mib(fp32[k]["saved"]) for k in labels], height=0.4, label="为反向保存 (saved)")
ax.set_yticks(list(ys), labels)
ax.invert_yaxis()
ax.set_xlabel("MiB（h = 4096，4096 个 token，FP32）")
ax.set_title("一个归一化层的显存：保存的张量与峰值")
ax.legend(loc="lower right", fontsize=8)
plt.tight_layout()
plt.show()
