# %% [markdown]
# # 第 14 章 动手实践：序列长度与注意力的显存
#
# 这份教程配合[第 14 章 序列长度优化](ch14.md)，回答五个问题：
#
# 1. H200 参考表里改变序列长度、或者对比 eager 与 SDPA 注意力的几行，模拟设备能不能复现？eager 多出来的显存是不是正好等于 softmax 输出（以及 dropout 掩码）的大小？
# 2. 序列长度从 256 加到 2048，eager 和 SDPA 的峰值各怎么涨？（GPT-2 small，FakeTensorMode）
# 3. FlashAttention 的分块 + 在线 softmax + 反向重算，用几十行 PyTorch 写出来是什么样？它和“按查询分块 + 激活检查点”、和 SDPA 各省多少显存？
# 4. 滑动窗口注意力：用掩码实现时显存还是 $S^2$，按窗口分块实现时才是 $S \cdot w$。
# 5. 变长数据：补齐到固定长度、补齐到批内最长、按长度分桶、打包（packing）各浪费多少 token、峰值差多少？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 1、2 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行；第 3–5 节用真实张量，既量显存也核对数值。

# %%
import datetime
import math
import random
import statistics

import torch
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, make_config
from vramlab.reference import reference_rows
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.workload import from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU          # 第 1、2 节：模拟设备上用 FakeTensorMode
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 复现 H200 参考表里与序列长度、注意力实现有关的行
#
# H200 参考表（`vramlab/data/h200_gpt2_peaks.md`：NVIDIA H200，PyTorch 2.11.0+cu130，transformers 5.17.0，2026-11-29 实测，稳态 `torch.cuda.max_memory_allocated()`）里，GPT-2 small、FP32 + AdamW、批大小 8 的配置中有 7 行与本章有关：序列长度 128 / 512 / 1024，以及 eager 与 SDPA 的对比（含 attention dropout 0.1 的一对）。`measure_workload` 按表里的方法（热身 1 步后测稳态峰值）在本机重测。

# %% tags=["h200_rows"]
ref = {r.name: r for r in reference_rows()}
ROWS = ["small_fp32_adamw_b8_s128", "small_fp32_adamw_b8_s512", "small_fp32_adamw_b8_s1024",
        "small_fp32_adamw_b8_s512_eager", "small_fp32_adamw_b8_s1024_eager",
        "small_fp32_adamw_b8_s512_drop0.1", "small_fp32_adamw_b8_s512_drop0.1_eager"]
sim = {name: measure_workload(from_reference_name(name), fake=FAKE, steps=1) for name in ROWS}

where = "本机 GPU" if ON_GPU else "模拟设备"
print(pad("配置", 40), pad("H200 MiB", 10), pad(f"{where} MiB", 14), "偏差")
for name in ROWS:
    r, m = ref[name].steady_mib, mib(sim[name].peak_bytes)
    print(pad(name, 40), pad(str(r), 10), pad(f"{m:.1f}", 14), f"{(m - r) / r:+.2%}")
    publish("h200_" + name.replace("small_fp32_adamw_b8_", "").replace(".", "") + "_mib", r)
publish("sim_dev_abs_max", max(abs(mib(sim[n].peak_bytes) / ref[n].steady_mib - 1) for n in ROWS), fmt="{:.2%}")

# %% [markdown]
# 再把 eager 比 SDPA 多出的部分摊到每一层，和公式对照。GPT-2 small 有 $L = 12$ 层、$a = 12$ 个头；eager 注意力为反向保存 softmax 输出 $[b, a, s, s]$，FP32 每层 $4abs^2$ 字节；打开 attention dropout 后还要存 1 字节的掩码和 4 字节的 dropout 输出，每层共 $(4 + 1 + 4)\,abs^2 = 9abs^2$ 字节。这就是 Korthikanti 等人 $5as/h$ 项（16 位激活值：$2 + 1 + 2 = 5$）的 FP32 版本。

# %%
L, A = 12, 12
PAIRS = [("s512", "small_fp32_adamw_b8_s512", "small_fp32_adamw_b8_s512_eager", 8, 512, 4),
         ("s1024", "small_fp32_adamw_b8_s1024", "small_fp32_adamw_b8_s1024_eager", 8, 1024, 4),
         ("s512 + dropout 0.1", "small_fp32_adamw_b8_s512_drop0.1", "small_fp32_adamw_b8_s512_drop0.1_eager", 8, 512, 9)]
devs_formula = []
print(pad("对比", 20), pad("公式 MiB/层", 14), pad("H200 MiB/层", 14), pad(f"{where} MiB/层", 16), "eager 比 SDPA（H200）")
for label, sdpa, eager, b, s, per in PAIRS:
    formula = per * A * b * s * s / 2**20
    h200 = (ref[eager].steady_mib - ref[sdpa].steady_mib) / L
    here = mib(sim[eager].peak_bytes - sim[sdpa].peak_bytes) / L
    print(pad(label, 20), pad(f"{formula:.1f}", 14), pad(f"{h200:.1f}", 14), pad(f"{here:.1f}", 16),
          f"{ref[eager].steady_mib / ref[sdpa].steady_mib - 1:+.1%}")
    key = label.split()[0] + ("_drop" if "dropout" in label else "")
    publish(f"formula_{key}_mib", formula, fmt="{:.0f}")
    publish(f"h200_{key}_per_layer_mib", h200, fmt="{:.1f}")
    publish(f"sim_{key}_per_layer_mib", here, fmt="{:.1f}")
    publish(f"h200_{key}_eager_extra", ref[eager].steady_mib / ref[sdpa].steady_mib - 1, fmt="{:+.1%}")
    publish(f"h200_{key}_eager_extra_pct", ref[eager].steady_mib / ref[sdpa].steady_mib - 1, fmt="{:.1%}")
    devs_formula.append(abs(h200 / formula - 1))           # H200 与公式的相对差
publish("h200_formula_dev_max", max(devs_formula), fmt="{:.1%}")
print()
for a, b in [("small_fp32_adamw_b8_s512", "small_fp32_adamw_b8_s1024"),
             ("small_fp32_adamw_b8_s512_eager", "small_fp32_adamw_b8_s1024_eager")]:
    print(f"{pad(a + ' → s1024', 44)} H200 {ref[b].steady_mib / ref[a].steady_mib - 1:+.1%}，"
          f"{where} {sim[b].peak_bytes / sim[a].peak_bytes - 1:+.1%}")
    publish("h200_growth_" + ("eager" if "eager" in a else "sdpa"), ref[b].steady_mib / ref[a].steady_mib - 1, fmt="{:+.1%}")
    publish("h200_growth_" + ("eager" if "eager" in a else "sdpa") + "_pct", ref[b].steady_mib / ref[a].steady_mib - 1, fmt="{:.1%}")

# %% [markdown]
# 三对的每层差值都与公式吻合：eager 多出来的，正好是那几个 $[b, a, s, s]$ 的张量。SDPA 在 GPU 上走 memory-efficient 核（FP32）或 FlashAttention 核（FP16/BF16），两者都不保存它们。
#
# 看看峰值时刻的分类统计（GPT-2 small，批大小 8）：

# %%
CATS = [("parameters", "参数"), ("optimizer_state", "优化器状态"), ("activations", "激活值"),
        ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS 工作区")]
cols = ["small_fp32_adamw_b8_s512", "small_fp32_adamw_b8_s1024", "small_fp32_adamw_b8_s512_eager",
        "small_fp32_adamw_b8_s1024_eager"]
print(pad("类别（峰值时刻，MiB）", 22), *(pad(c.replace("small_fp32_adamw_b8_", ""), 12) for c in cols))
for key, label in CATS:
    print(pad(label, 22), *(pad(f"{mib(sim[c].breakdown.get(key, 0)):.1f}", 12) for c in cols))
print(pad("峰值", 22), *(pad(f"{mib(sim[c].peak_bytes):.1f}", 12) for c in cols))
for c in cols:
    key = c.replace("small_fp32_adamw_b8_", "")
    for cat in ("activations", "temporaries", "parameters"):
        publish(f"bd_{key}_{cat}_mib", mib(sim[c].breakdown.get(cat, 0)), fmt="{:.1f}")
opt_states = [mib(sim[c].breakdown.get("optimizer_state", 0)) for c in cols]
publish("bd_optimizer_min_mib", min(opt_states), fmt="{:.0f}")
publish("bd_optimizer_max_mib", max(opt_states), fmt="{:.0f}")
publish("bd_eager_act_growth", sim["small_fp32_adamw_b8_s1024_eager"].breakdown["activations"]
        / sim["small_fp32_adamw_b8_s512_eager"].breakdown["activations"], fmt="{:.1f}")

# %% [markdown]
# 序列长度翻倍时，SDPA 的“激活值”和“临时张量”（主要是 `[b, s, 50257]` 的 log-softmax 输出和它的梯度）都差不多翻倍，这是线性增长；eager 的激活值涨得更多，因为其中的分数矩阵是 $s^2$ 的。参数和优化器状态与序列长度无关，所以整个峰值涨不到 2 倍。

# %% [markdown]
# ## 2. 峰值随序列长度的曲线：eager 与 SDPA
#
# GPT-2 small 的位置嵌入只有 1024 个位置；为了画到 2048，这里把 `n_positions` 改成 2048（参数多 $1024 \times 768$ 个，约 3 MiB），批大小 4，只做一次前向 + 反向（不含优化器），在 FakeTensorMode 下测峰值和峰值时刻的激活值。

# %% tags=["sweep"]
SEQS = [256, 512, 1024, 2048]


def fwd_bwd(attention, seq, batch=4, name="gpt2-small"):
    """一次前向 + 反向的峰值；返回 (峰值字节, 峰值时刻的激活值字节)。"""
    cfg = make_config(name, attention=attention)
    cfg.n_positions = max(cfg.n_positions, seq)
    with vramlab.open_device("auto", fake=FAKE) as dev:
        with torch.device(dev.torch_device):
            model = transformers.GPT2LMHeadModel(cfg)
        model.train()
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev.torch_device)
        dev.reset_peak()
        model(input_ids=ids, labels=ids).loss.backward()
        return dev.max_allocated(), dev.breakdown().get("activations", 0)


sweep = {(att, s): fwd_bwd(att, s) for att in ("sdpa", "eager") for s in SEQS}
print(pad("序列长度", 10), pad("SDPA 峰值", 12), pad("eager 峰值", 12), pad("SDPA 激活值", 13), pad("eager 激活值", 14),
      "eager 激活值 − SDPA 激活值 与 12 层 4abs² 之比")
for s in SEQS:
    (ps, acts), (pe, acte) = sweep["sdpa", s], sweep["eager", s]
    probs = L * 4 * A * 4 * s * s
    print(pad(str(s), 10), pad(f"{mib(ps):.0f}", 12), pad(f"{mib(pe):.0f}", 12), pad(f"{mib(acts):.0f}", 13),
          pad(f"{mib(acte):.0f}", 14), f"{(acte - acts) / probs:.3f}")
    publish(f"sweep_s{s}_sdpa_peak_mib", mib(ps), fmt="{:.0f}")
    publish(f"sweep_s{s}_eager_peak_mib", mib(pe), fmt="{:.0f}")
    publish(f"sweep_s{s}_sdpa_act_mib", mib(acts), fmt="{:.0f}")
    publish(f"sweep_s{s}_eager_act_mib", mib(acte), fmt="{:.0f}")
    publish(f"sweep_s{s}_eager_extra_mib", round(mib(acte)) - round(mib(acts)))
    publish(f"sweep_s{s}_ratio", (acte - acts) / probs, fmt="{:.3f}")
publish("sweep_s2048_extra_over_formula", (round(mib(sweep["eager", 2048][1])) - round(mib(sweep["sdpa", 2048][1]))) / 9216, fmt="{:.3f}")
publish("sweep_extra_growth_1024_2048", (round(mib(sweep["eager", 2048][1])) - round(mib(sweep["sdpa", 2048][1])))
        / (round(mib(sweep["eager", 1024][1])) - round(mib(sweep["sdpa", 1024][1]))), fmt="{:.1f}")

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

CJK = sorted({f.name for f in font_manager.fontManager.ttflist if f.name.startswith("Noto Sans CJK")},
             key=lambda n: "SC" not in n)
if CJK:
    plt.rcParams["font.family"] = CJK[0]
plt.rcParams["axes.unicode_minus"] = False

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for att, style in [("sdpa", "o-"), ("eager", "s--")]:
    axes[0].plot(SEQS, [mib(sweep[att, s][0]) for s in SEQS], style, label=att)
    axes[1].plot(SEQS, [mib(sweep[att, s][1]) for s in SEQS], style, label=att)
axes[0].set_title("峰值 peak allocated (MiB)")
axes[1].set_title("峰值时刻的激活值 activations at peak (MiB)")
for ax in axes:
    ax.set_xlabel("序列长度 sequence length")
    ax.set_xticks(SEQS)
    ax.grid(alpha=0.3)
    ax.legend()
fig.suptitle("GPT-2 small, batch 4, one forward + backward, FP32")
fig.tight_layout()
plt.show()

# %% [markdown]
# SDPA 的曲线是直线（每次翻倍，激活值也大约翻倍）；eager 的曲线向上弯，序列长度每翻倍，多出的部分（最后一列与 $4abs^2$ 之比接近 1）变成 4 倍。序列越长，分数矩阵在峰值里的占比越大。

# %% [markdown]
# ## 3. FlashAttention 的原理，用 PyTorch 写一遍
#
# 评分练习的起始代码就是下面的 `naive_attention`：显式算出 $QK^\top/\sqrt{d}$，加因果掩码，softmax，再乘 $V$。autograd 为反向保存 softmax 的输出（$B \cdot H \cdot S^2$ 个 FP32）和掩码。
#
# 我们再写三个版本，输出和梯度都应与它一致：
#
# - `F.scaled_dot_product_attention(q, k, v, is_causal=True)`：PyTorch 的 SDPA。在 GPU 上 FP32 输入走 memory-efficient 核（模拟设备照它记账），不保存 $S^2$ 的任何东西；
# - `chunked_attention(..., ckpt=True)`：按查询分块，每块用 `torch.utils.checkpoint` 包住，反向时重算这一块的分数；
# - `FlashAttentionPy`：FlashAttention 算法的教学版。前向按块扫过 K、V，用**在线 softmax**维护每行的最大值 $m$ 和指数和 $\ell$，只保存输出 $O$ 和每行的 log-sum-exp；反向按块**重算**概率 $P = \exp(S - \text{lse})$。真正的 FlashAttention 把每一块放在 SRAM 里算，这里只是用 PyTorch 演示同样的数学和同样的保存策略。

# %%
def naive_attention(q, k, v):
    """起始代码：显式的因果注意力，保存 B·H·S² 的概率矩阵。"""
    S, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _chunk(qc, kc, vc, start):
    """查询 [start, start + len(qc)) 对键 [0, start + len(qc)) 的因果注意力。"""
    d = qc.shape[-1]
    scores = qc @ kc.transpose(-2, -1) / math.sqrt(d)
    qi = torch.arange(start, start + qc.shape[-2], device=qc.device)[:, None]
    kj = torch.arange(kc.shape[-2], device=qc.device)[None, :]
    scores = scores.masked_fill(kj > qi, float("-inf"))
    return torch.softmax(scores, dim=-1) @ vc


def chunked_attention(q, k, v, chunk=128, ckpt=True):
    outs = []
    for start in range(0, q.shape[-2], chunk):
        end = min(start + chunk, q.shape[-2])
        args = (q[..., start:end, :], k[..., :end, :], v[..., :end, :], start)
        outs.append(checkpoint(_chunk, *args, use_reentrant=False) if ckpt else _chunk(*args))
    return torch.cat(outs, dim=-2)


class FlashAttentionPy(torch.autograd.Function):
    """FlashAttention（Dao et al., 2022）算法 1 的教学版：因果、无 dropout。"""

    @staticmethod
    def forward(ctx, q, k, v, block=128):
        B, H, S, D = q.shape
        scale = 1 / math.sqrt(D)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, S, dtype=torch.float32, device=q.device)
        for i in range(0, S, block):
            qi = q[..., i:i + block, :]
            rows = torch.arange(i, i + qi.shape[-2], device=q.device)[:, None]
            m = torch.full(qi.shape[:-1], float("-inf"), device=q.device)   # 每行目前见过的最大分数
            l = torch.zeros(qi.shape[:-1], device=q.device)                 # 每行 exp(分数 − m) 之和
            acc = torch.zeros_like(qi)                                       # 未归一化的输出
            for j in range(0, i + qi.shape[-2], block):                       # 因果：只看到这一块的最后一行为止
                s = qi @ k[..., j:j + block, :].transpose(-2, -1) * scale
                cols = torch.arange(j, j + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                fix = torch.exp(m - m_new)                                   # 旧的和按新的最大值重新缩放
                l = l * fix + p.sum(-1)
                acc = acc * fix[..., None] + p @ v[..., j:j + block, :]
                m = m_new
            out[..., i:i + block, :] = acc / l[..., None]
            lse[..., i:i + block] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)                             # 不保存任何 S×S 的东西
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        block, S, D = ctx.block, q.shape[-2], q.shape[-1]
        scale = 1 / math.sqrt(D)
        delta = (dout * out).sum(-1)                                         # 每行的 rowsum(dO ∘ O)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for i in range(0, S, block):
            qi, doi = q[..., i:i + block, :], dout[..., i:i + block, :]
            rows = torch.arange(i, i + qi.shape[-2], device=q.device)[:, None]
            for j in range(0, i + qi.shape[-2], block):
                kj, vj = k[..., j:j + block, :], v[..., j:j + block, :]
                s = qi @ kj.transpose(-2, -1) * scale
                cols = torch.arange(j, j + s.shape[-1], device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
                p = torch.exp(s - lse[..., i:i + block, None])              # 重算这一块的概率
                dv[..., j:j + block, :] += p.transpose(-2, -1) @ doi
                ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i:i + block, None])
                dq[..., i:i + block, :] += ds @ kj * scale
                dk[..., j:j + block, :] += ds.transpose(-2, -1) @ qi * scale
        return dq, dk, dv, None


def flash_py(q, k, v):
    return FlashAttentionPy.apply(q, k, v)

# %% [markdown]
# 先单独看在线 softmax：把一行分数切成几段依次读入，只维护 $m$ 和 $\ell$ 两个数，最后得到的 log-sum-exp 与一次算完的结果相同（Milakov & Gimelshein, 2018）。

# %%
row = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 5
m, l = float("-inf"), 0.0
for piece in row.split(128):
    m_new = max(m, piece.max().item())
    l = l * math.exp(m - m_new) + torch.exp(piece - m_new).sum().item()
    m = m_new
print(f"分 8 段在线计算的 log-sum-exp：{m + math.log(l):.12f}")
print(f"torch.logsumexp 一次算完：      {torch.logsumexp(row, 0).item():.12f}")

# %% [markdown]
# 现在在设备上比较五种实现：批大小 $B = 2$，$H = 4$ 个头，序列长度 $S = 1024$，头维度 $d = 64$，FP32。一个 $B \cdot H \cdot S^2$ 的 FP32 张量是 $2 \times 4 \times 1024^2 \times 4$ 字节 = 32 MiB；q、k、v、输出各是 2 MiB。“额外峰值”是峰值减去调用前已分配的显存（q、k、v、上游梯度，以及事先分配好的 cuBLAS 工作区）。

# %% tags=["five"]
B, H, S, D = 2, 4, 1024, 64
IMPLS = [("naive（起始代码）", naive_attention),
         ("SDPA，is_causal=True", sdpa_attention),
         ("按查询分块，不加检查点", lambda q, k, v: chunked_attention(q, k, v, ckpt=False)),
         ("按查询分块 + 检查点", chunked_attention),
         ("FlashAttentionPy（教学版）", flash_py)]


def warm_up(dev):
    """先做一次带反向的矩阵乘：前向、反向线程的 cuBLAS 工作区（H200 上各 32 MiB）就此分配好，
    不会被算进后面的“额外峰值”，和一个已经跑过几步的训练进程一样。"""
    x = torch.ones(8, 8, device=dev.torch_device, requires_grad=True)
    (x @ x).sum().backward()


def run_attention(fn, B=B, H=H, S=S, D=D):
    """在设备上跑一次前向 + 反向，返回 (额外峰值字节, 输出, (dq, dk, dv))，结果都拷回 CPU。"""
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(B, H, S, D, generator=gen) for _ in range(4)]
    with vramlab.open_device("auto") as dev:
        warm_up(dev)
        q, k, v, g = (dev.to_device(t) for t in tensors)
        for t in (q, k, v):
            t.requires_grad_(True)
        dev.reset_peak()
        before = dev.allocated()
        out = fn(q, k, v)
        out.backward(g)
        extra = dev.max_allocated() - before
        result = (extra, out.detach().cpu(), tuple(t.grad.cpu() for t in (q, k, v)))
    return result


results = {label: run_attention(fn) for label, fn in IMPLS}
base_extra, base_out, base_grads = results[IMPLS[0][0]]
print(pad("实现", 30), pad("额外峰值 MiB", 14), pad("相对起始代码", 14), pad("输出最大差", 12), "梯度最大差")
for label, _ in IMPLS:
    extra, out, grads = results[label]
    dout = (out - base_out).abs().max().item()
    dgrad = max((a - b).abs().max().item() for a, b in zip(grads, base_grads))
    print(pad(label, 30), pad(f"{mib(extra):.1f}", 14), pad(f"{extra / base_extra:.2f}", 14),
          pad(f"{dout:.1e}", 12), f"{dgrad:.1e}")
    key = ["naive", "sdpa", "chunked", "chunked_ckpt", "flash_py"][[l for l, _ in IMPLS].index(label)]
    publish(f"five_{key}_mib", mib(extra), fmt="{:.1f}")

# %% [markdown]
# 几点读法：
#
# - naive 的额外峰值约等于 3 个 32 MiB 的 $S^2$ 张量：softmax 输出被保存到反向，前向时分数、缩放后的分数、掩码后的分数轮流占着临时空间，反向时又要为概率和分数各算一个同样大小的梯度。
# - 只按查询分块、不加检查点，前向的临时张量变小了，但每一块的概率仍被 autograd 保存到反向，合起来还是因果部分的 $S^2$ 量级，峰值降得有限。
# - 分块加检查点后，保存的只有 q、k、v 的切片（视图，不占新显存）；反向时一次只重算一块，峰值里剩下的是一块的分数和概率（$B \cdot H \cdot 128 \cdot S$，每个 4 MiB）及其梯度。SDPA 和教学版 FlashAttention 更进一步：除了 q、k、v 只保存输出和 log-sum-exp，分块又小（教学版每块 $128 \times 128$），额外峰值只剩几个 $[B, H, S, d]$ 大小（2 MiB）的张量：输出、dq、dk、dv。
# - 所有版本的输出和梯度与起始代码的差都在 FP32 舍入误差的量级。

# %% [markdown]
# 额外峰值随序列长度怎么变？naive 应当按 $S^2$ 涨（$S$ 翻倍，约 4 倍），SDPA 按 $S$ 涨（约 2 倍）。

# %%
print(pad("S", 8), pad("naive 额外峰值 MiB", 22), "SDPA 额外峰值 MiB")
scaling = {}
for s in (256, 512, 1024):
    n = run_attention(naive_attention, S=s)[0]
    f = run_attention(sdpa_attention, S=s)[0]
    scaling[s] = (n, f)
    print(pad(str(s), 8), pad(f"{mib(n):.2f}", 22), f"{mib(f):.2f}")
    publish(f"scale_s{s}_naive_mib", mib(n), fmt="{:.2f}")
    publish(f"scale_s{s}_sdpa_mib", mib(f), fmt="{:.2f}")
publish("scale_naive_growth_min", min(scaling[512][0] / scaling[256][0], scaling[1024][0] / scaling[512][0]), fmt="{:.1f}")
publish("scale_naive_growth_max", max(scaling[512][0] / scaling[256][0], scaling[1024][0] / scaling[512][0]), fmt="{:.1f}")
publish("scale_sdpa_growth_min", min(scaling[512][1] / scaling[256][1], scaling[1024][1] / scaling[512][1]), fmt="{:.1f}")
publish("scale_sdpa_growth_max", max(scaling[512][1] / scaling[256][1], scaling[1024][1] / scaling[512][1]), fmt="{:.1f}")

# %% [markdown]
# ## 4. 滑动窗口注意力：掩码省不了显存
#
# Longformer 式的滑动窗口让第 $i$ 个 token 只看前面 $w$ 个 token（这里是因果版本：键 $j$ 满足 $i - w < j \le i$）。有两种写法：
#
# - **掩码写法**：照常算完整的 $S \times S$ 分数，再把窗口外的位置设成 $-\infty$。结果对，但显存（和计算量）还是 $S^2$；
# - **分块写法**：查询按 $w$ 个一块，每块只和它需要的 $2w$ 个键算分数，分数矩阵总共 $S \times 2w$，显存是 $O(S \cdot w)$。
#
# 另外把掩码交给 SDPA（`attn_mask=`）：不保存分数，但要一个 $S \times S$ 的布尔掩码（1 字节一个元素），计算量也仍是 $S^2$。

# %%
SW, WIN = 2048, 128


def window_mask(S, w, device):
    i = torch.arange(S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (j > i - w)          # True = 可以看


def window_masked(q, k, v, w=WIN):
    S, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    scores = scores.masked_fill(~window_mask(S, w, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def window_sdpa(q, k, v, w=WIN):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(q.shape[-2], w, q.device))


def window_blocked(q, k, v, w=WIN):
    S, d = q.shape[-2], q.shape[-1]
    outs = []
    for start in range(0, S, w):
        end = min(start + w, S)
        k0 = max(0, start - w)                     # 这一块需要的键：[start − w, end)
        s = q[..., start:end, :] @ k[..., k0:end, :].transpose(-2, -1) / math.sqrt(d)
        i = torch.arange(start, end, device=q.device)[:, None]
        j = torch.arange(k0, end, device=q.device)[None, :]
        s = s.masked_fill(~((j <= i) & (j > i - w)), float("-inf"))
        outs.append(torch.softmax(s, dim=-1) @ v[..., k0:end, :])
    return torch.cat(outs, dim=-2)


WINDOW_IMPLS = [("掩码写法（S×S 分数）", window_masked), ("SDPA + attn_mask", window_sdpa),
                ("按窗口分块（S×2w 分数）", window_blocked)]
wres = {label: run_attention(fn, B=1, S=SW) for label, fn in WINDOW_IMPLS}
full_bytes = 1 * H * SW * SW * 4
band_bytes = 1 * H * SW * 2 * WIN * 4
print(f"S = {SW}，w = {WIN}，B = 1，H = {H}：一个 S×S 的 FP32 分数张量 {mib(full_bytes):.0f} MiB，"
      f"S×2w 的 {mib(band_bytes):.0f} MiB\n")
wbase = wres[WINDOW_IMPLS[0][0]]
print(pad("实现", 26), pad("额外峰值 MiB", 14), pad("输出最大差", 12), "梯度最大差")
for label, _ in WINDOW_IMPLS:
    extra, out, grads = wres[label]
    dgrad = max((a - b).abs().max().item() for a, b in zip(grads, wbase[2]))
    print(pad(label, 26), pad(f"{mib(extra):.1f}", 14), pad(f"{(out - wbase[1]).abs().max().item():.1e}", 12),
          f"{dgrad:.1e}")
    key = ["masked", "sdpa", "blocked"][[l for l, _ in WINDOW_IMPLS].index(label)]
    publish(f"window_{key}_mib", mib(extra), fmt="{:.1f}")

# %% [markdown]
# 三种写法结果一样，显存差一个数量级：稀疏注意力省不省显存，取决于实现有没有真的跳过那些位置。Longformer 为此写了专门的 CUDA 核，BigBird 把稀疏模式安排成块，用稠密的小矩阵乘来算。

# %% [markdown]
# ## 5. 变长数据：补齐、分桶与打包
#
# 先生成 256 条“对话数据”的长度：对数正态分布，截断在 16 到 512 之间（`tiny` 模型最多 512 个位置）。批大小 8，比较四种组批方式实际送进模型的 token 数：
#
# 1. 全部补齐到 512（`padding="max_length"`）；
# 2. 每批补齐到批内最长（`padding="longest"`，Hugging Face `DataCollatorWithPadding` 的默认）；
# 3. 按长度分组再补齐到批内最长：用 Hugging Face `LengthGroupedSampler` 的排序函数 `get_length_grouped_indices`（先随机打乱，再在 8 批组成的“大批”里按长度排序，`TrainingArguments(train_sampling_strategy="group_by_length")` 用的就是它）；
# 4. 打包：每批的 8 条首尾相接成一行，不补齐（`DataCollatorWithFlattening`）。

# %%
from transformers.trainer_pt_utils import get_length_grouped_indices

rng = random.Random(0)
lengths = [min(512, max(16, int(rng.lognormvariate(5.0, 0.8)))) for _ in range(256)]
BATCH = 8
batches_random = [lengths[i:i + BATCH] for i in range(0, len(lengths), BATCH)]
order = get_length_grouped_indices(lengths, BATCH, generator=torch.Generator().manual_seed(0))
batches_grouped = [[lengths[i] for i in order[j:j + BATCH]] for j in range(0, len(order), BATCH)]
real = sum(lengths)
plans = {"补齐到 512": sum(512 * len(b) for b in batches_random),
         "补齐到批内最长": sum(max(b) * len(b) for b in batches_random),
         "按长度分组 + 批内最长": sum(max(b) * len(b) for b in batches_grouped),
         "打包（不补齐）": real}
print(f"样本数 {len(lengths)}，长度中位数 {statistics.median(lengths):.0f}，平均 {statistics.mean(lengths):.1f}，"
      f"最长 {max(lengths)}，真实 token 共 {real}\n")
print(pad("组批方式", 24), pad("送进模型的位置数", 18), "其中补齐的比例")
for label, total in plans.items():
    print(pad(label, 24), pad(str(total), 18), f"{(total - real) / total:.1%}")
for key, total in zip(["max", "longest", "grouped", "packed"], plans.values()):
    publish(f"plan_{key}_positions", total)
    publish(f"plan_{key}_pad_share", (total - real) / total, fmt="{:.1%}")
publish("len_median", statistics.median(lengths), fmt="{:.0f}")
publish("len_real_tokens", real)

# %% [markdown]
# 补齐到固定长度时，大半计算和激活值花在补齐 token 上。按批内最长补齐省得不多，因为随机组成的一批里总有一条偏长；按长度分组后批内长度接近，补齐的比例降到一成多；打包则完全没有补齐。注意分组改变了批次的组成（长样本扎堆），打包改变了“一批”的形状（1 行、总长不定），两者都会影响训练动态，要配合按 token 数算损失、打乱桶的顺序等做法。
#
# 下面在设备上真跑一批：取一个随机批，用 `tiny`（2 层 GPT-2，SDPA）比较补齐与打包的峰值，并核对两者的损失相同。打包用 Hugging Face 的 `DataCollatorWithFlattening`：它把 8 条拼成 `[1, 总长]`，`position_ids` 在每条样本开头归零，`labels` 在每条开头放 `-100`，这样上一条的最后一个 token 不会去“预测”下一条的第一个 token。

# %%
from transformers import DataCollatorWithFlattening

batch_lens = batches_random[3]
tok_gen = torch.Generator().manual_seed(1)
samples = [torch.randint(0, 1024, (n,), generator=tok_gen).tolist() for n in batch_lens]
print("这一批的长度：", batch_lens, "，真实 token", sum(batch_lens))


def padded_batch(samples, to_len):
    ids = torch.zeros(len(samples), to_len, dtype=torch.long)
    mask = torch.zeros(len(samples), to_len, dtype=torch.long)
    labels = torch.full((len(samples), to_len), -100, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, :len(s)] = torch.tensor(s)
        mask[r, :len(s)] = 1
        labels[r, :len(s)] = torch.tensor(s)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


packed = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": s} for s in samples])
print("打包后的形状：", tuple(packed["input_ids"].shape), "；position_ids 的前 12 个：",
      packed["position_ids"][0, :12].tolist(), "…")
print("每条样本开头的 position_ids 为 0 的个数：", int((packed["position_ids"] == 0).sum()))


def train_peak(batch):
    with vramlab.open_device("auto") as dev:
        warm_up(dev)
        model = build_model("tiny", device=dev.torch_device)
        model.train()
        inputs = {k: dev.to_device(v) for k, v in batch.items()}
        dev.reset_peak()
        before = dev.allocated()
        loss = model(**inputs).loss
        loss.backward()
        return dev.max_allocated() - before, loss.item()


cases = [("补齐到 512", padded_batch(samples, 512)),
         ("补齐到批内最长", padded_batch(samples, max(batch_lens))),
         ("打包（DataCollatorWithFlattening）", dict(packed))]
print()
print(pad("组批方式", 36), pad("形状", 12), pad("额外峰值 MiB", 14), "损失")
for key, (label, batch) in zip(["max", "longest", "packed"], cases):
    extra, loss = train_peak(batch)
    print(pad(label, 36), pad(str(tuple(batch["input_ids"].shape)), 12), pad(f"{mib(extra):.2f}", 14), f"{loss:.6f}")
    publish(f"batch_{key}_mib", mib(extra), fmt="{:.2f}")
    publish(f"batch_{key}_loss", loss, fmt="{:.6f}")
    publish(f"batch_{key}_shape", ", ".join(str(x) for x in batch["input_ids"].shape))
publish("batch_real_tokens", sum(batch_lens))
publish("batch_longest", max(batch_lens))

# %% [markdown]
# 三种方式的损失相同（都只对真实 token 的下一个 token 求平均），峰值却差了几倍：在这个小模型里，logits（`[行数, 长度, 1024]`）和各层激活值都与送进模型的位置数成正比。
#
# 这里的打包在 SDPA 下是怎么做到“样本之间互不注意”的？transformers 5.17 发现 `position_ids` 中途归零（且没有传 `attention_mask`），就据此生成一个块对角的因果掩码交给 SDPA，掩码本身是 $[1, 1, T, T]$ 的布尔张量（$T$ 是总长）。在 GPU 上用 `attn_implementation="flash_attention_2"` 时，同样的 `position_ids` 会被换算成每条样本的起止位置（`cu_seqlens`），交给 `flash_attn_varlen_func`，连这个掩码也不需要。
#
# 本教程的数字都在模拟设备上测得（H200 一列除外），它们是确定的：换一台没有 GPU 的机器重跑，结果相同。模拟设备不计时间，各种写法的速度差别（例如按块循环的 Python 版本比融合的 CUDA 核慢得多）要在真 GPU 上量。
