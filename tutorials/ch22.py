# %% [markdown]
# # 第 22 章 动手实践：量化省下多少显存，又丢掉多少精度
#
# 这份教程配合[第 22 章 模型量化技术](ch22.md)，用 `vramlab` 和 bitsandbytes 回答六个问题：
#
# 1. 一个 7B 模型的权重在 FP32 / BF16 / INT8 / INT4 / NF4 下各占多少？缩放系数（scale）又要多少？键值缓存呢？（算术）
# 2. 逐张量、逐通道、分组三种缩放粒度，对称（absmax）与非对称（零点）两种映射，误差差多少？NF4 比均匀 INT4 好在哪？
# 3. LLM.int8() 为什么要把离群特征单独拿出来用 16 位算？
# 4. GPTQ 和 AWQ 这两种训练后量化（PTQ）方法，凭什么比“直接四舍五入”误差小？（手写的最小实现）
# 5. 在模拟设备上实测：Llama-2-7B 形状的全部线性层权重在各种格式下常驻多少显存？一次 W8A16 矩阵乘，整块反量化与按行分块反量化的峰值差多少？（练习 `ch22-int8-linear` 的预演）
# 6. 量化感知训练（QAT）能把低位宽下丢掉的精度找回来吗？它训练时省显存吗？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 5 节的 7B 形状在 FakeTensorMode 下运行（只有形状、没有数据）；其余各节用真实张量。

# %%
import datetime
import logging
import math

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # 没装可选的 kernels 包时，它在 CPU 上会打印一条无关的警告

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from torch.nn.utils import parametrize

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, get_preset
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()
import bitsandbytes as bnb                                   # pip install bitsandbytes
import bitsandbytes.functional as bnbF

torch.set_num_threads(1)          # 小张量为主：单线程在共享的机器上反而更快，结果也可复现
ON_GPU = banner(f"transformers {transformers.__version__}，bitsandbytes {bnb.__version__}")
FAKE = not ON_GPU
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("transformers", transformers.__version__)
publish("bitsandbytes", bnb.__version__)

# %% [markdown]
# ## 1. 字节账：权重、缩放系数、键值缓存
#
# 量化（quantization）把一个浮点张量换成“低位宽整数 + 少量缩放系数”。设每个元素 $b$ 位，每 $g$ 个元素共用一个 $s$ 字节的缩放系数（有零点时再加一个），每个元素平均占
#
# $$\text{字节/元素} = \frac{b}{8} + \frac{s}{g}\;(+\ \frac{s_z}{g}).$$
#
# 下表按这个式子算 70 亿个参数（$7 \times 10^9$，把所有参数都当成线性层权重）的大小，是算术，不是测量。逐通道 INT8 假设每行 4096 个元素（Llama-2-7B 的隐藏维度）共用一个 FP16 缩放系数；NF4 是 QLoRA 的做法：每 64 个一块、FP32 的 absmax；“双重量化”再把这些 absmax 量化成 8 位、每 256 个再配一个 FP32 常数。

# %%
N7 = 7_000_000_000
FORMATS = [
    ("FP32", 4.0, "fp32"),
    ("FP16 / BF16", 2.0, "fp16"),
    ("INT8 逐通道（FP16 scale，每行 4096）", 1 + 2 / 4096, "int8"),
    ("INT4 分组 g=128（FP16 scale）", 0.5 + 2 / 128, "int4"),
    ("INT4 分组 g=128（FP16 scale + 零点）", 0.5 + 4 / 128, "int4z"),
    ("NF4 块 64（FP32 absmax）", 0.5 + 4 / 64, "nf4"),
    ("NF4 块 64 + 双重量化", 0.5 + 1 / 64 + 4 / (64 * 256), "nf4dq"),
]
print(pad("格式", 38), pad("字节/参数", 11), pad("位/参数", 9), pad("7B 权重 GB", 12), "GiB")
for name, bpp, key in FORMATS:
    print(pad(name, 38), pad(f"{bpp:.4f}", 11), pad(f"{bpp * 8:.3f}", 9), pad(f"{N7 * bpp / 1e9:.2f}", 12),
          f"{N7 * bpp / 2**30:.2f}")
    publish(f"fmt_{key}_bpp", f"{bpp:.4f}".rstrip("0").rstrip("."))
    publish(f"fmt_{key}_gb", N7 * bpp / 1e9, fmt="{:.2f}")

# %% [markdown]
# 键值缓存（KV cache）也能量化。Llama-2-7B 形状：32 层、32 个键值头、每头 128 维，每个 token 在每层存一份 K 和一份 V。下面按“每个头的每个 token 一个 FP16 缩放系数”（每 128 个元素一个）算 INT8 / INT4 的键值缓存，同样是算术。

# %%
cfg = get_preset("llama-7b").config
L, KVH, HD = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
per_token_elems = 2 * L * KVH * HD
print(f"每个 token 的键值缓存：2 × {L} 层 × {KVH} 头 × {HD} 维 = {per_token_elems:,} 个元素\n")
print(pad("格式", 26), pad("每 token KiB", 14), pad("批 1 × 4096 token GiB", 24), "批 8 × 4096 token GiB")
for name, bpe, key in [("FP16 / BF16", 2.0, "fp16"), ("INT8（每 128 个一个 scale）", 1 + 2 / 128, "int8"),
                       ("INT4（每 128 个一个 scale）", 0.5 + 2 / 128, "int4")]:
    b = per_token_elems * bpe
    print(pad(name, 26), pad(f"{b / 1024:.1f}", 14), pad(f"{b * 4096 / 2**30:.3f}", 24), f"{b * 8 * 4096 / 2**30:.2f}")
    publish(f"kv_{key}_kib", b / 1024, fmt="{:.0f}")
    publish(f"kv_{key}_b8_gib", b * 8 * 4096 / 2**30, fmt="{:.2f}")

# %% [markdown]
# ## 2. 手写量化器：映射方式与缩放粒度
#
# 两种映射（$b$ 位，$\lfloor\cdot\rceil$ 表示四舍五入）：
#
# - **对称 / absmax**：$s = \max|w| / (2^{b-1}-1)$，$q = \operatorname{clamp}(\lfloor w/s \rceil, -(2^{b-1}-1), 2^{b-1}-1)$，反量化 $\hat w = s\,q$。0 精确地映射到 0。
# - **非对称 / 零点**（zero-point）：$s = (\max w - \min w)/(2^b - 1)$，$z = \lfloor -\min w / s \rceil$，$q = \operatorname{clamp}(\lfloor w/s \rceil + z, 0, 2^b-1)$，$\hat w = s\,(q - z)$。适合一边偏的分布。
#
# 缩放粒度：整个张量一个 $s$（per-tensor）、每个输出通道（权重的一行）一个（per-channel）、每行每 $g$ 个元素一个（group-wise）。下面的 `quantize` 返回整数码和缩放系数，`dequantize` 还原。

# %%
def _view(w, gran):
    out, inn = w.shape
    if gran == "tensor":
        return w.reshape(1, 1, -1)
    if gran == "channel":
        return w.reshape(out, 1, inn)
    return w.reshape(out, inn // gran, gran)               # 分组：每行每 gran 个一组


@torch.no_grad()
def quantize(w, bits, gran="channel", sym=True):
    v = _view(w, gran)
    if sym:
        qmax = 2 ** (bits - 1) - 1
        scale = v.abs().amax(-1, keepdim=True).clamp_min(1e-12) / qmax
        q = torch.clamp(torch.round(v / scale), -qmax, qmax)
        zero = None
    else:
        qmax = 2 ** bits - 1
        lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)
        scale = (hi - lo).clamp_min(1e-12) / qmax
        zero = torch.round(-lo / scale)
        q = torch.clamp(torch.round(v / scale) + zero, 0, qmax)
    return q.to(torch.int8 if sym else torch.uint8), scale, zero


def dequantize(q, scale, zero, shape):
    x = q.float() if zero is None else q.float() - zero
    return (x * scale).reshape(shape)


def fake_quant(w, bits, gran="channel", sym=True):
    return dequantize(*quantize(w, bits, gran, sym), w.shape)


def rel(a, b):
    """相对误差 ‖a − b‖ / ‖b‖（Frobenius 范数）。"""
    return ((a - b).norm() / b.norm()).item()


# 一个“像真的”的权重：各行的尺度不同（对数正态），再撒 0.1% 的大值
g = torch.Generator().manual_seed(0)
OUT, IN = 1024, 512
W = torch.randn(OUT, IN, generator=g) * torch.exp(0.5 * torch.randn(OUT, 1, generator=g)) * 0.02
spikes = torch.rand(OUT, IN, generator=g) < 0.001
W[spikes] *= 10
X = torch.randn(256, IN, generator=g)
Y = X @ W.T

print(f"权重 {OUT}×{IN}：行尺度最大/最小 = {(W.abs().amax(1).max() / W.abs().amax(1).min()).item():.1f}\n")
publish("row_scale_ratio", (W.abs().amax(1).max() / W.abs().amax(1).min()).item(), fmt="{:.0f}")
publish("spike_share", spikes.float().mean().item(), fmt="{:.1%}")
print(pad("方案", 34), pad("权重相对误差", 14), "输出 XWᵀ 相对误差")
rows = [("INT8 对称 逐张量", 8, "tensor", True), ("INT8 对称 逐通道", 8, "channel", True),
        ("INT8 对称 分组 g=128", 8, 128, True),
        ("INT4 对称 逐张量", 4, "tensor", True), ("INT4 对称 逐通道", 4, "channel", True),
        ("INT4 对称 分组 g=128", 4, 128, True), ("INT4 对称 分组 g=64", 4, 64, True),
        ("INT4 非对称（零点）分组 g=64", 4, 64, False)]
errs = {}
for name, bits, gran, sym in rows:
    Wh = fake_quant(W, bits, gran, sym)
    print(pad(name, 34), pad(f"{rel(Wh, W):.4f}", 14), f"{rel(X @ Wh.T, Y):.4f}")
    errs[f"int{bits}{'' if sym else 'z'}_{gran if isinstance(gran, str) else f'g{gran}'}"] = (rel(Wh, W), rel(X @ Wh.T, Y))

for qt in ("fp4", "nf4"):
    packed, state = bnbF.quantize_4bit(W, blocksize=64, quant_type=qt)    # bitsandbytes，CPU 上可运行
    Wh = bnbF.dequantize_4bit(packed, state)
    print(pad(f"bitsandbytes {qt.upper()} 块 64", 34), pad(f"{rel(Wh, W):.4f}", 14), f"{rel(X @ Wh.T, Y):.4f}")
    errs[f"bnb_{qt}"] = (rel(Wh, W), rel(X @ Wh.T, Y))
for key, (ew, ey) in errs.items():
    publish(f"err_{key}_w", ew, fmt="{:.4f}")
    publish(f"err_{key}_y", ey, fmt="{:.4f}")
    publish(f"err_{key}_y2", ey, fmt="{:.2f}")
publish("err_int8_tensor_over_channel", errs["int8_tensor"][1] / errs["int8_channel"][1], fmt="{:.1f}")
print(f"\nbitsandbytes 的 NF4：packed {tuple(packed.shape)} {packed.dtype}（每字节两个 4 位码），"
      f"absmax {tuple(state.absmax.shape)} {state.absmax.dtype}")

# %% [markdown]
# 读表：
#
# - **INT8** 逐张量的误差是逐通道的近 10 倍：尺度相差 170 倍的行共用一个 $s$，小尺度的行只分到很少的码值；逐通道之后误差已经很小，分组再小一些。
# - **INT4** 只有 15 个码值，一个大尺度的行（或一个离群值）会拉大整张量的 $s$，把别的行“挤”成 0 或 ±1：逐张量误差很大，逐通道明显好转，分组再好一截。分组越小误差越小，但缩放系数越多（第 1 节的表）。
# - 这些权重整体以 0 为中心，但一个 64 个数的小组里最大值和最小值并不对称：零点映射只覆盖 $[\min, \max]$，还多用了一个码值（16 个对 15 个），所以误差更小，代价是每组多存一个零点。
# - **NF4** 的 16 个码值取在标准正态分布的分位点上（QLoRA），同样是每 64 个一块、4 位、只存一个 absmax，误差比对称的均匀码表（INT4 g=64、bitsandbytes 的 FP4）小，和带零点的 INT4 相当。
#
# 零点映射在什么时候有用？在**一边偏**的数据上，例如 GELU 之后的激活值（几乎都大于 −0.17）：

# %%
act = F.gelu(torch.randn(4096, 256, generator=g) * 2)
print(f"GELU 输出：最小 {act.min().item():.3f}，最大 {act.max().item():.3f}\n")
print(pad("方案（逐张量）", 22), "相对误差")
for bits in (8, 4):
    for sym in (True, False):
        name = f"INT{bits} {'对称' if sym else '非对称（零点）'}"
        print(pad(name, 22), f"{rel(fake_quant(act, bits, 'tensor', sym), act):.4f}")

# %% [markdown]
# 对称映射把 $[-\max, +\max]$ 均分，负半边的码值几乎没人用，等于白白丢了 1 位；零点映射把码值铺在 $[\min, \max]$ 上，INT4 的误差因此小了一大截。
#
# ## 3. LLM.int8()：离群特征
#
# Dettmers 等人（2022）发现，参数到 67 亿左右的 Transformer 里，隐藏状态会在**少数几个固定的特征维度**上出现幅度很大的离群值。INT8 矩阵乘 $XW^\top$ 要同时量化激活值 $X$ 和权重 $W$；LLM.int8() 的两步是：
#
# 1. **逐向量量化**（vector-wise）：$X$ 每行（每个 token）一个 scale，$W$ 每行（每个输出通道）一个 scale，整数矩阵乘的结果再乘以两者的外积：$Y \approx (s_X s_W^\top) \odot (Q_X Q_W^\top)$；
# 2. **混合精度分解**：$X$ 中任一元素绝对值超过阈值（默认 6.0）的那些**列**（特征维度），连同 $W$ 的对应列，用 16 位单独相乘；其余照常走 INT8，两部分相加。
#
# 下面造一批 64 个 token、1024 维的激活值，其中 4 个特征维度是 20–60 的离群值，手写这两步，再和 bitsandbytes 的 `Linear8bitLt` 对照。

# %%
T, D, DO = 64, 1024, 1024
Xa = torch.randn(T, D, generator=g)
outlier_dims = torch.tensor([17, 300, 555, 901])
Xa[:, outlier_dims] = (20 + 40 * torch.rand(T, 4, generator=g)) * torch.sign(torch.randn(T, 4, generator=g))
Wl = torch.randn(DO, D, generator=g) * 0.02
Yref = Xa @ Wl.T


def int8_vectorwise(x):                      # 每行一个 absmax scale
    s = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
    return torch.round(x / s).to(torch.int8), s


def int8_matmul(x, w):
    qx, sx = int8_vectorwise(x)
    qw, sw = int8_vectorwise(w)
    acc = qx.double() @ qw.double().T        # 整数累加（双精度浮点对这些整数是精确的），GPU 上是 INT8 张量核心 → INT32
    return acc.float() * sx * sw.T


def llm_int8(x, w, threshold=6.0):
    cols = (x.abs() >= threshold).any(dim=0)  # 离群特征维度
    y = int8_matmul(x[:, ~cols], w[:, ~cols])
    y += x[:, cols].half().float() @ w[:, cols].half().float().T     # 离群部分用 16 位
    return y, cols


y8 = int8_matmul(Xa, Wl)
yd, cols = llm_int8(Xa, Wl)
print(f"离群维度：{cols.nonzero().flatten().tolist()}，占全部特征的 {cols.float().mean().item():.2%}\n")
print(pad("做法", 40), "输出相对误差")
print(pad("逐向量 INT8，不分解", 40), f"{rel(y8, Yref):.4f}")
print(pad("逐向量 INT8 + 离群列用 16 位（手写）", 40), f"{rel(yd, Yref):.4f}")
publish("outlier_dims", int(cols.sum()))
publish("outlier_share", cols.float().mean().item(), fmt="{:.2%}")
publish("int8_nodecomp_err", rel(y8, Yref), fmt="{:.4f}")
publish("int8_decomp_err", rel(yd, Yref), fmt="{:.4f}")

lin = nn.Linear(D, DO, bias=False)
with torch.no_grad():
    lin.weight.copy_(Wl)
for thr in (0.0, 6.0):
    l8 = bnb.nn.Linear8bitLt(D, DO, bias=False, has_fp16_weights=False, threshold=thr)
    l8.load_state_dict(lin.state_dict())
    l8 = l8.to("cpu").eval()                  # 在 GPU 上是 .to("cuda")：这一步把权重量化成 INT8
    with torch.no_grad():
        yb = l8(Xa.half()).float()
    print(pad(f"bitsandbytes Linear8bitLt(threshold={thr})", 40), f"{rel(yb, Yref):.4f}")
    publish(f"bnb_thr{thr:.0f}_err", rel(yb, Yref), fmt="{:.4f}")
print(f"\nLinear8bitLt 的权重：{l8.weight.dtype}，{tuple(l8.weight.shape)}；每个输出通道一个 scale：{tuple(l8.state.SCB.shape)} {l8.state.SCB.dtype}")

# %% [markdown]
# 没有分解时，离群值把那 64 个 token 每一行的 scale 都撑到约 0.2–0.5，普通维度（绝对值约 1）只剩下 $\pm 2$ 上下几个码值，误差很大；把 4 个离群维度（0.39% 的特征）拿出来用 16 位算，误差就回到 INT8 应有的水平。bitsandbytes 的 `Linear8bitLt(threshold=6.0)` 做的正是这件事，它在 CPU 上也能跑：`threshold=0.0` 时误差与手写的“不分解”相同，`threshold=6.0` 时降到同一量级（它把输入转成 FP16，离群部分的处理细节也与手写版不同，所以数字不完全一样）。注意 `threshold` 在 `Linear8bitLt` 里默认是 0.0（不分解），在 transformers 的 `BitsAndBytesConfig` 里 `llm_int8_threshold` 默认是 6.0。
#
# ## 4. 训练后量化的两个代表：GPTQ 与 AWQ（最小实现）
#
# 上面的“直接四舍五入”（round-to-nearest，RTN）是最朴素的训练后量化。GPTQ 和 AWQ 都只需要一小批**校准数据**（calibration data），不训练，但把目标从“权重误差最小”换成了“这一层的**输出**误差 $\lVert XW^\top - X\hat W^\top\rVert$ 最小”。
#
# - **GPTQ**（Frantar 等人，2022）：一列一列地量化权重，每量化一列，就用 $H = X^\top X$ 的逆，把这一列的误差摊到**还没量化**的那些列上去补偿（OBQ 的思路）。输入特征之间越相关，能补偿的越多。
# - **AWQ**（Lin 等人，2023）：激活值大的输入通道对应的权重更“显著”。给每个输入通道乘一个 $s_j = \overline{|X_j|}^{\alpha}$（量化前 $W_{:,j} \cdot s_j$，计算时 $X_j / s_j$，数学上等价），让显著的权重占到更多的量化分辨率；$\alpha$ 在 $[0, 1]$ 上网格搜索。
#
# 下面用一组**相关**、并带几个大幅度通道的校准输入（真实激活值两者都有），对第 2 节的权重做 INT4 逐通道量化，比较 RTN、GPTQ、AWQ 在校准集和另一批同分布数据上的输出误差。这只是一个合成的小实验，用来看清机制，不代表任何真实模型上的数字。

# %%
def make_inputs(n, seed):
    gg = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 32, generator=gg) @ MIX + 0.3 * torch.randn(n, IN, generator=gg)   # 低秩相关 + 噪声
    return z * CH_SCALE


gmix = torch.Generator().manual_seed(7)
MIX = torch.randn(32, IN, generator=gmix) / math.sqrt(32)
CH_SCALE = torch.ones(IN)
CH_SCALE[torch.randperm(IN, generator=gmix)[:8]] = 8.0          # 8 个大幅度输入通道
Xcal, Xval = make_inputs(1024, 1), make_inputs(1024, 2)


@torch.no_grad()
def gptq(W, X, bits, damp=0.01):
    """GPTQ（逐通道对称 scale，不分组，不做懒批更新）：逐列量化并补偿后面的列。"""
    W = W.clone()
    H = X.T @ X
    H += damp * H.diagonal().mean() * torch.eye(H.shape[0])
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)   # H⁻¹ 的上三角 Cholesky 因子
    qmax = 2 ** (bits - 1) - 1
    scale = W.abs().amax(dim=1, keepdim=True) / qmax
    Q = torch.empty_like(W)
    for j in range(W.shape[1]):
        q = torch.clamp(torch.round(W[:, j:j + 1] / scale), -qmax, qmax) * scale
        Q[:, j:j + 1] = q
        err = (W[:, j:j + 1] - q) / U[j, j]
        W[:, j + 1:] -= err @ U[j:j + 1, j + 1:]
    return Q


@torch.no_grad()
def awq(W, X, bits):
    """AWQ：按输入通道的平均幅度缩放，网格搜索指数 α，取校准集上输出误差最小的。"""
    mag = X.abs().mean(dim=0)
    best = None
    for alpha in [i / 10 for i in range(11)]:
        s = mag.pow(alpha).clamp_min(1e-4)
        s = s / (s.max() * s.min()).sqrt()
        Wq = fake_quant(W * s, bits, "channel") / s
        err = rel(X @ Wq.T, X @ W.T)
        if best is None or err < best[0]:
            best = (err, alpha, Wq)
    return best[2], best[1]


Wq_rtn = fake_quant(W, 4, "channel")
Wq_gptq = gptq(W, Xcal, 4)
Wq_awq, alpha = awq(W, Xcal, 4)
print(pad("INT4 逐通道", 22), pad("校准集输出误差", 16), "另一批数据输出误差")
for name, Wq, key in (("RTN（四舍五入）", Wq_rtn, "rtn"), ("GPTQ", Wq_gptq, "gptq"), (f"AWQ（α = {alpha:.1f}）", Wq_awq, "awq")):
    print(pad(name, 22), pad(f"{rel(Xcal @ Wq.T, Xcal @ W.T):.4f}", 16), f"{rel(Xval @ Wq.T, Xval @ W.T):.4f}")
    publish(f"ptq_{key}_cal", rel(Xcal @ Wq.T, Xcal @ W.T), fmt="{:.4f}")
    publish(f"ptq_{key}_val", rel(Xval @ Wq.T, Xval @ W.T), fmt="{:.4f}")
publish("awq_alpha", alpha, fmt="{:.1f}")

# %% [markdown]
# 三者存下来的东西一样（每个权重 4 位 + 每行一个 scale），显存完全相同；差别只在“选哪个整数”。GPTQ 利用输入特征之间的相关性，把每一列的舍入误差往后面的列上补，在这组低秩相关的输入上误差降得最多，但它在校准集上的误差明显低于另一批数据，说明它对校准集有一点“过拟合”；AWQ 只调了一个指数 $\alpha$，降得少一些，两批数据上的误差却几乎一样。真实的 GPTQ 还会分组（常用 `group_size=128`）、按 128 列一批做“懒更新”来用好 GPU；AWQ 还会裁剪权重范围。它们在真实大模型上的效果见正文引用的论文。
#
# ## 5. 显存：常驻的权重，和反量化的临时张量
#
# ### 5.1 Llama-2-7B 形状的全部线性层，在各种格式下常驻多少
#
# 在 FakeTensorMode 的模拟设备上，按 `llama-7b` 预设（Llama-2-7B 形状）建出 32 层 × 7 个线性层的 BF16 权重（嵌入层和输出层不算，量化库通常也不量化它们），再逐层转成各种格式、全部留在显存里，读 `dev.allocated()` 的增量。转换过程中的峰值减去常驻量，就是逐层转换时的临时张量。INT4 用上面的对称分组量化，再把两个 4 位码打包进一个字节；NF4 直接调用 bitsandbytes 的 `quantize_4bit`。

# %%
with torch.device("meta"):
    meta_model = build_model("llama-7b")
SHAPES = [tuple(m.weight.shape) for n, m in meta_model.named_modules()
          if isinstance(m, nn.Linear) and ".layers." in n]
del meta_model
N_LIN = sum(o * i for o, i in SHAPES)
print(f"{len(SHAPES)} 个线性层，{N_LIN:,} 个权重；形状：{sorted(set(SHAPES))}\n")
publish("n_linear", len(SHAPES))
publish("n_lin_weights", f"{N_LIN:,}")
publish("lin_bf16_gb", N_LIN * 2 / 1e9, fmt="{:.1f}")


def to_int8(w):                               # 逐输出通道对称 INT8，scale 存 BF16
    q, s, _ = quantize(w, 8, "channel")
    return q.reshape(w.shape), s.reshape(-1).to(torch.bfloat16)


def to_int4(w, group=128):                    # 分组对称 INT4，两个码打包进一个 uint8
    q, s, _ = quantize(w, 4, group)
    u = (q.reshape(w.shape[0], -1) + 8).to(torch.uint8)              # [-7, 7] → [1, 15]
    return (u[:, 0::2] | (u[:, 1::2] << 4)), s.reshape(w.shape[0], -1).to(torch.bfloat16)


CONVERT = [
    ("FP32", lambda w: w.float()),
    ("BF16", lambda w: w.clone()),
    ("INT8 逐通道 + BF16 scale", to_int8),
    ("INT4 g=128 打包 + BF16 scale", to_int4),
    ("NF4 块 64（bitsandbytes）", lambda w: bnbF.quantize_4bit(w, blocksize=64, quant_type="nf4")),
    ("NF4 + 双重量化（bitsandbytes）", lambda w: bnbF.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                                                  compress_statistics=True)),
]
KEYS = dict(zip((c[0] for c in CONVERT), ("fp32", "bf16", "int8", "int4", "nf4", "nf4dq")))
resident = {}
with vramlab.open_device("auto", fake=FAKE) as dev, torch.no_grad():
    weights = [torch.randn(s, dtype=torch.bfloat16, device=dev.torch_device) for s in SHAPES]
    bf16_bytes = dev.allocated()
    print(pad("格式", 32), pad("常驻 MiB", 12), pad("字节/权重", 11), pad("相对 BF16", 11), "逐层转换的临时张量 MiB")
    for name, fn in CONVERT:
        base, kept, temp = dev.allocated(), [], 0
        for w in weights:                       # 逐层转换；记下每层转换时超出其结果的临时张量
            dev.reset_peak()
            kept.append(fn(w))
            temp = max(temp, dev.max_allocated() - dev.allocated())
        held = dev.allocated() - base
        resident[name] = held
        print(pad(name, 32), pad(f"{mib(held):,.1f}", 12), pad(f"{held / N_LIN:.4f}", 11),
              pad(f"{held / bf16_bytes:.3f}", 11), f"{mib(temp):.1f}")
        publish(f"res_{KEYS[name]}_mib", f"{mib(held):,.1f}")
        publish(f"res_{KEYS[name]}_bpw", held / N_LIN, fmt="{:.4f}")
        publish(f"res_{KEYS[name]}_ratio", held / bf16_bytes, fmt="{:.3f}")
        del kept

# %% [markdown]
# 常驻量和第 1 节的算术对得上（这里只有线性层，约 64.8 亿个权重）：INT8 是 BF16 的一半，INT4 / NF4 约四分之一多一点，多出来的就是缩放系数；双重量化把 NF4 的 absmax 从每块 4 字节压成 1 字节。“临时张量”一列是逐层转换时最大的那一层的中间结果（除法、取整的 FP32 张量），只在转换时出现；bitsandbytes 的量化在这里是一个自定义算子，模拟设备只看到它的输出，所以那两行几乎是 0。
#
# 有一个容易踩的坑：量化权重时如果**没有**关掉 autograd，而权重又 `requires_grad=True`（`nn.Parameter` 默认如此），`abs()`、`amax()` 这些运算会为反向保存中间张量，量化结果的 `grad_fn` 把它们一直留在显存里：

# %%
with vramlab.open_device("auto", fake=FAKE) as dev:
    p = nn.Parameter(torch.randn(11008, 4096, dtype=torch.bfloat16, device=dev.torch_device))
    for ctx_name, ctx in (("torch.no_grad() 里", torch.no_grad()), ("忘了 no_grad", torch.enable_grad())):
        base = dev.allocated()
        with ctx:
            s = p.abs().amax(dim=1, keepdim=True).float() / 127
            q = torch.round(p.float() / s).clamp(-127, 127).to(torch.int8)
        print(pad(ctx_name, 20), f"量化后多占 {mib(dev.allocated() - base):.1f} MiB（INT8 权重本身 {mib(q.numel()):.1f} MiB）")
        held = round(mib(dev.allocated() - base), 1)
        publish("nograd_held_mib" if ctx_name.startswith("torch") else "grad_held_mib", held, fmt="{:.1f}")
        if ctx_name.startswith("torch"):
            nograd_held = held
        else:
            publish("grad_extra_mib", held - nograd_held, fmt="{:.0f}")
        del s, q

# %% [markdown]
# 多出来的 86 MiB 是 `p.abs()` 的结果（BF16，与权重一样大），被 `amax` 的反向留着。一层是 86 MiB，一个 7B 模型就是好几 GB。
#
# ### 5.2 W8A16 矩阵乘：整块反量化 vs 按行分块反量化
#
# 只量化权重（weight-only）时，矩阵乘前要把 INT8 权重还原成浮点。函数的约定与练习 `ch22-int8-linear` 相同：
#
# $$y = x \,(\,W_{\text{int8}} \odot s\,)^\top,\qquad s \in \mathbb{R}^{\text{out}}\ \text{（每个输出通道一个）}$$
#
# - **整块反量化**：`weight_int8.to(x.dtype) * scale[:, None]` 一次造出整个浮点权重（FP32 是 INT8 的 4 倍），`to()` 的结果和乘法的结果还同时存在一会儿；
# - **按行分块**：预先分配输出，每次只反量化 `block` 行输出通道，算出输出的这几列写回去。真实的 weight-only 内核（GPU 上）更进一步：在片上存储里按小块反量化，根本不把浮点权重写回显存。
#
# 规模取 Llama-2-7B 一个注意力投影的形状（$4096 \times 4096$），16 个 token，FP32 激活值。先做一次小矩阵乘，让 cuBLAS 工作区（模拟设备上 32 MiB 的 `cuda_overhead`）在测量前就存在，于是下面的“额外峰值”只算函数本身。

# %%
def int8_linear_whole(x, weight_int8, scale):
    w = weight_int8.to(x.dtype) * scale[:, None].to(x.dtype)    # 整个权重的浮点副本
    return x @ w.T


def int8_linear_blocked(x, weight_int8, scale, block=256, drop=True):
    out = torch.empty(x.shape[0], weight_int8.shape[0], dtype=x.dtype, device=x.device)
    for i in range(0, weight_int8.shape[0], block):
        w = weight_int8[i:i + block].to(x.dtype) * scale[i:i + block, None].to(x.dtype)   # 只反量化 block 行
        out[:, i:i + block] = x @ w.T
        if drop:
            del w      # 否则上一块的 w 要等下一块的乘法算完、重新赋值时才释放：三份而不是两份
    return out


results = []
with vramlab.open_device("auto") as dev, torch.no_grad():
    gd = torch.Generator().manual_seed(3)
    w_fp = torch.randn(4096, 4096, generator=gd) * 0.02
    q8, s8 = int8_vectorwise(w_fp)
    weight_int8, scale = dev.to_device(q8), dev.to_device(s8.flatten())
    x = dev.to_device(torch.randn(16, 4096, generator=gd))
    del w_fp, q8, s8
    _ = x[:, :8] @ x[:8, :8]                                    # 预热：cuBLAS 工作区
    ref = (x.cpu() @ (weight_int8.cpu().float() * scale.cpu()[:, None]).T)
    for name, fn in [("整块反量化", int8_linear_whole)] + [
            (f"按行分块 block={b}", lambda x, w, s, b=b: int8_linear_blocked(x, w, s, b)) for b in (1024, 256, 64)] + [
            ("按行分块 block=256，不 del", lambda x, w, s: int8_linear_blocked(x, w, s, 256, drop=False))]:
        base = dev.allocated()
        n0 = len(dev.snapshot()["timeline"])
        dev.reset_peak()
        y = fn(x, weight_int8, scale)
        extra = dev.max_allocated() - base
        tl = [e["allocated"] - base for e in dev.snapshot()["timeline"][n0:]]
        results.append((name, extra, dev.max_allocated(), rel(y.cpu(), ref), tl))
        del y
    int8_bytes = weight_int8.numel()

print(f"INT8 权重 {mib(int8_bytes):.1f} MiB；同样大小的 FP32 权重 {mib(4 * int8_bytes):.1f} MiB\n")
publish("w8a16_int8_mib", mib(int8_bytes), fmt="{:.0f}")
publish("w8a16_fp32_mib", mib(4 * int8_bytes), fmt="{:.0f}")
publish("w8a16_out_mib", mib(16 * 4096 * 4), fmt="{:.2f}")          # 输出 16 × 4096 个 FP32
publish("w8a16_whole_over_int8", results[0][1] / int8_bytes, fmt="{:.0f}")
publish("w8a16_whole_step_mib", mib(results[0][4][0]), fmt="{:.0f}")       # 第一次分配：to() 的 FP32 结果
publish("w8a16_block256_tl_max_mib", mib(max(results[2][4])), fmt="{:.2f}")
print(pad("做法", 28), pad("函数的额外峰值 MiB", 20), pad("相对整块", 10), pad("总峰值 MiB", 12), "与参考输出的相对误差")
for (name, extra, peak, err, _), key in zip(results, ("whole", "block1024", "block256", "block64", "block256_nodel")):
    publish(f"w8a16_{key}_extra_mib", mib(extra), fmt="{:.2f}")
    publish(f"w8a16_{key}_ratio", extra / results[0][1], fmt="{:.3f}")
    print(pad(name, 28), pad(f"{mib(extra):.2f}", 20), pad(f"{extra / results[0][1]:.3f}", 10),
          pad(f"{mib(peak):.1f}", 12), f"{err:.1e}")

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()           # 没有中文字体时只用英文标签，避免出现方框
fig, ax = plt.subplots(figsize=(8.5, 3.6))
for name, extra, peak, err, tl in results[:1] + results[2:3]:
    label = name if ZH else name.replace("整块反量化", "whole-weight dequant").replace("按行分块", "row blocks,")
    ax.plot(range(len(tl)), [mib(v) for v in tl], lw=1.2, marker=".", ms=3, label=label)
ax.set_xlabel("分配/释放事件序号" if ZH else "allocation event")
ax.set_ylabel("函数调用以来新增的已分配显存 (MiB)" if ZH else "allocated since the call (MiB)")
ax.set_title("W8A16：4096×4096 INT8 权重，16 个 token" if ZH else "W8A16: 4096x4096 INT8 weight, 16 tokens")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 整块反量化的额外峰值约是 INT8 权重本身的 8 倍（`to()` 的 FP32 结果和乘法的 FP32 结果同时存在）；按行分块后，额外峰值只剩一块的两份浮点副本加上输出（一块是 `block` × 4096 × 4 字节，输出 0.25 MiB），块越小越低。表的最后一行是同一个循环去掉 `del w`：Python 里 `w` 这个名字一直指着上一块的副本，直到下一块的乘法算完、重新赋值才放开，于是下一块的 `.to()` 和乘法进行时有三份浮点副本同时活着。分块的代价是更多次、更小的矩阵乘（GPU 上每次都是一次内核启动），所以块不会切得无限小；真正的融合内核在片上做反量化，连一块的浮点副本都不写回显存。
#
# ## 6. 量化感知训练（QAT）
#
# ### 6.1 精度：PTQ 掉了的，QAT 能找回来
#
# QAT 在训练（或微调）时就让前向“看到”量化：权重先经过**伪量化**（fake quantization，量化再立刻反量化，数值落在量化网格上、类型仍是浮点），再参与计算。`round` 的导数几乎处处为 0，反向用**直通估计器**（straight-through estimator，STE）：把伪量化当成恒等函数，梯度原样传给浮点权重。一行写法是
#
# $$\tilde w = w + \operatorname{sg}\big(\hat w - w\big),$$
#
# 其中 $\operatorname{sg}$ 是 stop-gradient（PyTorch 的 `.detach()`）：前向得到 $\hat w$，反向 $\partial \tilde w / \partial w = 1$。
#
# 下面在一个合成的 10 分类任务上（标签由一个随机的“教师”网络给出）训练一个 3 层 MLP，先做 PTQ，再用 QAT 微调 150 步，比较测试准确率。

# %%
class FakeQuant(nn.Module):
    """权重伪量化 + STE；用 torch.nn.utils.parametrize 挂到任意层的 weight 上。"""

    def __init__(self, bits, gran="channel"):
        super().__init__()
        self.bits, self.gran = bits, gran

    def forward(self, w):
        with torch.no_grad():
            wq = fake_quant(w, self.bits, self.gran)
        return w + (wq - w).detach()            # 前向 = wq，反向 = 恒等


gm = torch.Generator().manual_seed(11)
teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))
Xtr, Xte = torch.randn(8192, 32, generator=gm), torch.randn(4096, 32, generator=gm)
with torch.no_grad():
    ytr, yte = teacher(Xtr).argmax(1), teacher(Xte).argmax(1)


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def fit(model, steps, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gi = torch.Generator().manual_seed(5)
    for _ in range(steps):
        idx = torch.randint(0, len(Xtr), (256,), generator=gi)
        loss = F.cross_entropy(model(Xtr[idx]), ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


@torch.no_grad()
def accuracy(model):
    return (model(Xte).argmax(1) == yte).float().mean().item()


def ptq_copy(model, bits, gran="channel"):
    q = make_mlp()
    q.load_state_dict(model.state_dict())
    with torch.no_grad():
        for m in q:
            if isinstance(m, nn.Linear):
                m.weight.copy_(fake_quant(m.weight, bits, gran))
    return q


fp = make_mlp()
fit(fp, 600, 3e-3)
print(pad("模型", 46), "测试准确率")
print(pad("FP32", 46), f"{accuracy(fp):.2%}")
publish("acc_fp32", accuracy(fp), fmt="{:.2%}")
for bits, gran in ((8, "channel"), (4, "tensor"), (4, "channel"), (2, "channel")):
    print(pad(f"PTQ INT{bits} {'逐张量' if gran == 'tensor' else '逐通道'}", 46), f"{accuracy(ptq_copy(fp, bits, gran)):.2%}")
    publish(f"acc_int{bits}_{gran}", accuracy(ptq_copy(fp, bits, gran)), fmt="{:.2%}")

qat = make_mlp()
qat.load_state_dict(fp.state_dict())
for m in qat:
    if isinstance(m, nn.Linear):
        parametrize.register_parametrization(m, "weight", FakeQuant(2))
fit(qat, 150, 1e-3)
with torch.no_grad():                                       # 训练完：把伪量化“烤”进权重，得到真正的 INT2 模型
    for m in qat:
        if isinstance(m, nn.Linear):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
print(pad("QAT INT2 逐通道（从 FP32 微调 150 步）", 46), f"{accuracy(qat):.2%}")
publish("acc_qat_int2", accuracy(qat), fmt="{:.2%}")
more = make_mlp()
more.load_state_dict(fp.state_dict())
fit(more, 150, 1e-3)
print(pad("（对照）FP32 再训练 150 步后做 PTQ INT2", 46), f"{accuracy(ptq_copy(more, 2)):.2%}")
publish("acc_more_int2", accuracy(ptq_copy(more, 2)), fmt="{:.2%}")

# %% [markdown]
# INT8 的 PTQ 几乎不掉点；INT4 掉一点（逐张量比逐通道掉得多一些）；到 INT2（每个权重只能是 $-s, 0, +s$）PTQ 就掉得很厉害。QAT 在伪量化的前向下继续训练，让网络自己适应量化网格，准确率大部分回来了；“对照”一行说明回来的不是多训练的那 150 步，而是“训练时看得见量化”。
#
# ### 6.2 显存：QAT 不比 BF16 训练省
#
# QAT 训练的仍然是**浮点**权重：优化器更新的是 FP32（或混合精度下的 FP32 主权重）参数，梯度、AdamW 状态一样不少；伪量化只是在前向里多算出一份“落在网格上”的浮点权重，还要为它的计算分配临时张量。低位宽的整数权重要到训练结束、转换之后才存在。下面在 `gpt2-mini`（批大小 2，序列长度 64，BF16 autocast，AdamW）上比较普通训练和 INT4 QAT（块里全部 `Conv1D` 权重逐通道伪量化）的稳态峰值。

# %%
def conv1d_fake_quant(model, bits):
    for name, m in model.named_modules():
        if type(m).__name__ == "Conv1D":        # GPT-2 的线性层：weight 形状 [in, out]
            parametrize.register_parametrization(m, "weight", FakeQuantT(bits))


class FakeQuantT(FakeQuant):
    def forward(self, w):                       # Conv1D 的输出通道在第 1 维：转置后逐行量化
        with torch.no_grad():
            wq = fake_quant(w.T, self.bits, self.gran).T
        return w + (wq - w).detach()


qat_rows = []
for label, bits in (("BF16 autocast 普通训练", None), ("BF16 autocast + INT4 QAT", 4)):
    with vramlab.open_device("auto") as dev:
        model = build_model("gpt2-mini", device=dev.torch_device)
        if bits:
            conv1d_fake_quant(model, bits)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, get_preset("gpt2-mini").vocab, (2, 64), generator=torch.Generator().manual_seed(0))
        ids = ids.to(dev.torch_device)
        for step in range(2):
            if step == 1:
                dev.reset_peak()                 # 第 1 步热身（AdamW 第一次 step 才建状态）
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        n_params = sum(p.numel() for p in model.parameters())
        qat_rows.append((label, dev.max_allocated(), dev.breakdown(), loss.item()))

print(f"gpt2-mini：{n_params:,} 个参数（FP32）\n")
print(pad("做法", 28), pad("稳态峰值 MiB", 14), pad("参数", 9), pad("梯度", 9), pad("优化器状态", 12), pad("激活值", 9), "临时张量")
for label, peak, bd, loss in qat_rows:
    print(pad(label, 28), pad(f"{mib(peak):.1f}", 14), *(pad(f"{mib(bd.get(k, 0)):.1f}", w) for k, w in
          (("parameters", 9), ("gradients", 9), ("optimizer_state", 12), ("activations", 9))), f"{mib(bd.get('temporaries', 0)):.1f}")
print(f"\nQAT / 普通 = {qat_rows[1][1] / qat_rows[0][1]:.3f}")
publish("qat_n_params", f"{n_params:,}")
publish("qat_ratio", qat_rows[1][1] / qat_rows[0][1], fmt="{:.3f}")
for (label, peak, bd, loss), key in zip(qat_rows, ("plain", "qat")):
    publish(f"qat_{key}_peak_mib", mib(peak), fmt="{:.1f}")
    for part in ("parameters", "gradients", "optimizer_state"):
        publish(f"qat_{key}_{part}_mib", mib(bd.get(part, 0)), fmt="{:.1f}")
diff = {part: abs(round(mib(qat_rows[0][2].get(part, 0)), 1) - round(mib(qat_rows[1][2].get(part, 0)), 1))
        for part in ("parameters", "gradients", "optimizer_state")}
publish("qat_same_parts", "、".join(n for p, n in (("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"))
                                   if diff[p] == 0) or "没有一项")
publish("qat_grad_diff_mib", diff["gradients"], fmt="{:.1f}")

# %% [markdown]
# 参数、梯度、优化器状态三列完全一样，峰值也几乎相同：QAT 没有让任何一份模型状态变小。这一配置的峰值出现在反向末尾，那时伪量化的中间结果（每层一份浮点的 $\hat w$、求 scale 时的临时张量）早已释放，所以没有抬高峰值；不用 autocast 的 FP32 QAT 会为反向额外保存每层一份 FP32 的 $\hat w$（与权重一样大），PyTorch 的 `FakeQuantize` 还会为截断的 STE 保存掩码，这些都只会让 QAT 比普通训练多占显存。所以 QAT 的用处是**提高低位宽推理的精度**，而不是省训练显存；要在训练时省显存，得靠 QLoRA 这类“冻结的量化基座 + 少量可训练参数”的做法（[第 24 章](ch24.md)）。
