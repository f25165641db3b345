# %% [markdown]
# # 第 19 章 动手实践：优化器状态占多少显存，怎样让它变小或搬走
#
# 这份教程配合[第 19 章 优化器显存优化](ch19.md)，用 `vramlab` 回答四个问题：
#
# 1. SGD、带动量的 SGD、AdamW（三种实现）、Adafactor 每个参数各存几个字节？`optimizer.step()` 时还要多少临时显存？（GPT-2 small，FakeTensorMode）
# 2. 这些字节在一个完整的训练步里什么时候决定峰值？模拟设备能否复现 H200 参考表里优化器相关的几行？
# 3. 8-bit 优化器的分块动态量化是怎么回事？为什么要分块？（先手写实现看清原理，再用 bitsandbytes 实测）
# 4. 把 AdamW 的状态放到主存、在主存里更新（ZeRO-Offload 的思路）：结果是否和普通的 AdamW 一样？峰值降多少？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 1、2 节的 GPT-2 small 在 FakeTensorMode 下运行（只有形状、没有数据）；第 3 节只比较数值；第 4 节用真实张量跑 4 层的 `gpt2-mini`。

# %%
import datetime
import gc
import importlib.util
import math

import torch
import transformers

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, get_preset
from vramlab.reference import reference_rows
from vramlab.runner import measure_workload
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.workload import from_reference_name

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU          # 第 1、2 节：模拟设备上用 FakeTensorMode
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
for lib in ("bitsandbytes", "torchao"):
    print(f"{lib:13s}", "已安装" if importlib.util.find_spec(lib) else "未安装（pip install " + lib + "）")

# %% [markdown]
# ## 1. 每个参数几个字节：逐个优化器量一遍
#
# 优化器状态（optimizer state）只和参数有关，和批大小、序列长度无关，所以这一节不跑前向和反向：在 GPT-2 small 的每个参数上直接放一个同形状的梯度，然后调用 `optimizer.step()`。`dev.reset_peak()` 放在 `step()` 之前，于是 `dev.max_allocated()` 减去 step 之前的已分配显存，就是**step 本身**额外用了多少：优化器状态（第一次 step 时才创建）加上计算更新时的临时张量。`dev.breakdown()` 给出峰值时刻的分类。
#
# 参加比较的有：
#
# - `SGD`（没有状态）和 `SGD(momentum=0.9)`（一个动量缓冲）；
# - `AdamW` 的三种实现：`foreach=True`（多张量实现，PyTorch 在 GPU 上的默认）、`foreach=False`（逐个参数的 for 循环）、`fused=True`（融合内核）；
# - `torch.optim.Adafactor`：默认逐个参数计算，另测一次 `foreach=True`。

# %%
OPTIMIZERS = [
    ("SGD", lambda ps: torch.optim.SGD(ps, lr=1e-3)),
    ("SGD 动量 0.9", lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9)),
    ("AdamW foreach", lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True)),
    ("AdamW for 循环", lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=False)),
    ("AdamW fused", lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True)),
    ("Adafactor", lambda ps: torch.optim.Adafactor(ps, lr=1e-3)),
    ("Adafactor foreach", lambda ps: torch.optim.Adafactor(ps, lr=1e-3, foreach=True)),
]

step_rows = []
with vramlab.open_device("auto", fake=FAKE) as dev:
    model = build_model("gpt2-small", device=dev.torch_device)
    params = list(model.parameters())
    N = sum(p.numel() for p in params)
    largest = max(params, key=lambda p: p.numel())
    for name, make in OPTIMIZERS:
        opt = make(params)
        for _ in range(2):                          # 第 1 步创建状态；第 2 步是稳态
            for p in params:
                p.grad = torch.ones_like(p)         # 形状对即可：这里只关心字节数
            before = dev.allocated()
            dev.reset_peak()
            opt.step()
            peak = dev.max_allocated()
            bd = dev.breakdown()
            opt.zero_grad(set_to_none=True)
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v))
        step_rows.append(dict(name=name, state=state, before=before, peak=peak, temp=bd.get("temporaries", 0), bd=bd))
        del opt
        gc.collect()

print(f"GPT-2 small：{N:,} 个参数，FP32 参数 {mib(4 * N):.1f} MiB；最大的参数是词嵌入 {tuple(largest.shape)}，"
      f"{mib(largest.numel() * 4):.1f} MiB\n")
print(pad("优化器", 20), pad("状态 MiB", 10), pad("字节/参数", 11), pad("step 前 MiB", 13),
      pad("step 峰值 MiB", 15), "其中临时张量 MiB")
STEP_KEYS = {"SGD": "sgd", "SGD 动量 0.9": "sgdm", "AdamW foreach": "adamw_foreach", "AdamW for 循环": "adamw_loop",
             "AdamW fused": "adamw_fused", "Adafactor": "adafactor", "Adafactor foreach": "adafactor_foreach"}
for r in step_rows:
    print(pad(r["name"], 20), pad(f"{mib(r['state']):.1f}", 10), pad(f"{r['state'] / N:.4f}", 11),
          pad(f"{mib(r['before']):.1f}", 13), pad(f"{mib(r['peak']):.1f}", 15), f"{mib(r['temp']):.1f}")
    key = STEP_KEYS[r["name"]]
    publish(f"step_{key}_state_mib", mib(r["state"]), fmt="{:.1f}")
    publish(f"step_{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"step_{key}_temp_mib", mib(r["temp"]), fmt="{:.1f}")
publish("largest_param_mib", mib(largest.numel() * 4), fmt="{:.1f}")
publish("params_mib", mib(4 * N), fmt="{:.1f}")
temps = {STEP_KEYS[r["name"]]: r["temp"] for r in step_rows}
publish("foreach_minus_loop_temp_mib", round(mib(temps["adamw_foreach"]), 1) - round(mib(temps["adamw_loop"]), 1), fmt="{:.1f}")

# %% [markdown]
# 逐行读：
#
# - **SGD** 没有状态，step 前后只有参数和梯度（各 $4N$ 字节）。**带动量的 SGD** 每个参数 4 字节。
# - **AdamW** 每个参数 8 字节：一阶矩 `exp_avg` 和二阶矩 `exp_avg_sq` 各一个 FP32 张量。多出来的零头（字节/参数略大于 8）是每个参数张量各有一个标量 `step`。三种实现的**状态一样大**，差别在临时张量：`foreach` 实现一次对所有参数调用 `torch._foreach_sqrt(exp_avg_sqs)`，临时多出整整一份参数大小的张量列表；for 循环实现一次只处理一个参数，临时张量最多是最大那个参数（词嵌入）的一两倍；`fused` 实现在一个内核里原地更新，没有临时张量。
# - **Adafactor** 的状态只有约 1 MiB：`torch.optim.Adafactor` 不保存一阶矩，矩阵的二阶矩只存行向量和列向量（$n + m$ 个数，而不是 $n \times m$）。它的 `foreach=True` 同样临时多一份参数大小，所以 PyTorch 让它默认走 for 循环（见其文档字符串）。
#
# 下面把 step 峰值时刻的组成画成堆叠柱状图。

# %%
import matplotlib
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
EN_NAMES = {"SGD 动量 0.9": "SGD momentum 0.9", "AdamW for 循环": "AdamW for-loop"}

fig, ax = plt.subplots(figsize=(9, 4.2))
labels = [r["name"] if ZH else EN_NAMES.get(r["name"], r["name"]) for r in step_rows]
labels = [lab.replace(" ", "\n", 1) for lab in labels]
bottom = [0.0] * len(step_rows)
for key, zh, en in (("parameters", "参数", "parameters"), ("gradients", "梯度", "gradients"),
                    ("optimizer_state", "优化器状态", "optimizer state"), ("temporaries", "临时张量", "temporaries")):
    vals = [mib(r["bd"].get(key, 0)) for r in step_rows]
    ax.bar(labels, vals, bottom=bottom, label=zh if ZH else en)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax.set_ylabel("step 峰值时刻的显存 (MiB)" if ZH else "memory at the step peak (MiB)")
ax.set_title("GPT-2 small，FP32，optimizer.step() 的峰值组成" if ZH else "GPT-2 small, FP32: what optimizer.step() holds at its peak")
ax.tick_params(axis="x", labelsize=8)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. 在完整的训练步里：什么时候是优化器说了算
#
# 一个训练步的峰值要么出现在反向刚开始（激活值最多），要么出现在 `optimizer.step()`（梯度全部存在、再加上状态和临时张量）。H200 参考表里有四行只换了优化器的配置（GPT-2 small，FP32，批大小 8，序列长度 512）。下面在模拟设备上复现它们，并列出峰值出现的位置。

# %% tags=["h200_rows"]
NAMES = ["small_fp32_adamw_b8_s512", "small_fp32_adamw_noforeach_b8_s512",
         "small_fp32_adafactor_b8_s512", "small_fp32_sgdm_b8_s512"]
ref = {r.name: r for r in reference_rows()}
print(pad("配置", 38), pad("H200 MiB", 10), pad("模拟设备 MiB", 14), pad("偏差", 9), pad("状态 MiB", 10), "峰值位置")
full = {}
for name in NAMES:
    m = measure_workload(from_reference_name(name), backend="auto", fake=FAKE, steps=1)
    full[name] = m
    h = ref[name].steady_mib
    print(pad(name, 38), pad(str(h), 10), pad(f"{mib(m.peak_bytes):.1f}", 14),
          pad(f"{(mib(m.peak_bytes) - h) / h:+.2%}", 9), pad(f"{mib(m.breakdown.get('optimizer_state', 0)):.1f}", 10),
          m.peak_where.split(" @ ")[0])
H200_KEYS = dict(zip(NAMES, ("adamw", "noforeach", "adafactor", "sgdm")))
base = ref["small_fp32_adamw_b8_s512"]
for name in NAMES:
    key = H200_KEYS[name]
    publish(f"h200_{key}_mib", ref[name].steady_mib)
    publish(f"h200_{key}_ms", ref[name].step_ms, fmt="{:.1f}")
    publish(f"sim_{key}_mib", mib(full[name].peak_bytes), fmt="{:.1f}")
    if key != "adamw":
        publish(f"h200_{key}_diff_mib", f"{ref[name].steady_mib - base.steady_mib:+d}".replace("-", "−"))
        publish(f"h200_{key}_saving_mib", base.steady_mib - ref[name].steady_mib)
publish("h200_sgdm_saving_pct", 1 - ref["small_fp32_sgdm_b8_s512"].steady_mib / base.steady_mib, fmt="{:.0%}")
publish("h200_adafactor_saving_pct", 1 - ref["small_fp32_adafactor_b8_s512"].steady_mib / base.steady_mib, fmt="{:.0%}")
publish("h200_first_step_mib", base.first_step_mib)
publish("h200_purebf16_mib", ref["small_purebf16_adamw_b8_s512"].steady_mib)
publish("sim_dev_abs_max", max(abs(mib(full[n].peak_bytes) / ref[n].steady_mib - 1) for n in NAMES), fmt="{:.2%}")

# %% [markdown]
# 四行的峰值都在反向刚开始、对 log-softmax 求梯度的时刻（`_log_softmax_backward_data`）：批大小 8、序列长度 512 时，激活值和 logits 比优化器一步的全部开销还大。所以在这个配置下：
#
# - 优化器状态**常驻**显存，无论峰值在哪里都要算上：AdamW 比带动量的 SGD 多 4 字节/参数，比 Adafactor 多约 8 字节/参数，峰值的差别基本就是状态的差别；
# - `foreach` 与 for 循环的差别（那一份参数大小的临时张量）只在 step 里出现，**没有**碰到峰值，所以两行几乎一样（H200 上差 6 MiB，模拟设备上相同）。
#
# 把第 1 节的 step 峰值和这里对照：AdamW `foreach` 的 step 峰值是参数 + 梯度 + 状态 + 临时张量，约 $4 \times 475.5$ MiB；只要前向、反向的峰值低于它（小批次、短序列、开了激活检查点），峰值就由 step 决定，这时 `foreach` 的临时张量也直接算进峰值。

# %% [markdown]
# ## 3. 8-bit 状态：分块动态量化
#
# 8-bit 优化器（Dettmers 等人，2022）把一阶矩和二阶矩存成 8 位整数，每个参数 2 字节；更新时把一块状态反量化成 FP32，做普通的 Adam 更新，再量化回去。两个关键设计：
#
# - **动态量化**（dynamic quantization）：256 个码值不是均匀分布的，而是像浮点数一样“指数 + 小数”，靠近 0 的地方密、远处疏，适合跨好几个数量级的优化器状态；
# - **分块**（block-wise）：每 2048 个数一块（论文的块大小；bitsandbytes 0.50.2 的实现每块 256 个数），各用自己的最大绝对值（absmax）归一化。一个离群值只影响它所在的那一块。
#
# 为了看清原理，下面按 bitsandbytes 的 `create_dynamic_map` 构造码表，手写量化与反量化（纯 PyTorch，在 CPU 上运行，只比较数值）。先在 `tiny` 上用普通 AdamW 训练 20 步，取真实的一阶矩和二阶矩，比较四种 8 位表示的误差。

# %%
def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes 的动态数据类型：256 个码值，“指数”越小，小数部分的码值越少。"""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        n = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        b = torch.linspace(0.1, 1, n)
        means = ((b[:-1] + b[1:]) / 2.0).tolist()
        data += [10 ** (-(max_exponent_bits - 1) + i) * x for x in means]
        if signed:
            data += [-(10 ** (-(max_exponent_bits - 1) + i)) * x for x in means]
    if additional_items > 0:
        b = torch.linspace(0.1, 1, additional_items + 1)
        means = ((b[:-1] + b[1:]) / 2.0).tolist()
        data += [10 ** (-(max_exponent_bits - 1) + i) * x for x in means]
        if signed:
            data += [-(10 ** (-(max_exponent_bits - 1) + i)) * x for x in means]
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(sorted(data))


def quantize(x, code, block):
    """x 按 block 个数一块，各自除以 absmax，再取码表里最近的码值；返回 uint8 码和每块的 absmax。"""
    flat = x.flatten()
    pad_n = (-flat.numel()) % block
    blocks = torch.cat([flat, flat.new_zeros(pad_n)]).view(-1, block)
    absmax = blocks.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    normed = blocks / absmax
    idx = torch.searchsorted(code, normed.contiguous()).clamp(1, 255)
    lower, upper = code[idx - 1], code[idx]
    idx = torch.where((normed - lower).abs() <= (upper - normed).abs(), idx - 1, idx)
    return idx.to(torch.uint8), absmax.squeeze(1)


def dequantize(q, absmax, code, shape):
    x = code[q.long()] * absmax[:, None]
    return x.flatten()[: math.prod(shape)].view(shape)


SIGNED, UNSIGNED = create_dynamic_map(True), create_dynamic_map(False)
LINEAR_S, LINEAR_U = torch.linspace(-1, 1, 256), torch.linspace(0, 1, 256)
print("动态码表（有符号）：", len(SIGNED), "个码值，最小正值", f"{SIGNED[SIGNED > 0].min().item():.2e}",
      "；线性码表最小正值", f"{LINEAR_S[LINEAR_S > 0].min().item():.2e}")

# 用普通 AdamW 训练 tiny 20 步，拿到真实的 m、v
torch.manual_seed(0)
tiny = build_model("tiny")
tiny.train()
ids = torch.randint(0, get_preset("tiny").vocab, (8, 64), generator=torch.Generator().manual_seed(1))
adamw = torch.optim.AdamW(tiny.parameters(), lr=1e-3)
for _ in range(20):
    tiny(input_ids=ids, labels=ids).loss.backward()
    adamw.step()
    adamw.zero_grad(set_to_none=True)
def errors(m, v, cs, cu, block):
    """m、v 各自量化再反量化；返回 m、v 的相对误差，v 中非零却变成 0 的比例，以及更新方向 m/(√v+ε) 的相对误差。"""
    mh = dequantize(*quantize(m, cs, block), cs, m.shape)
    vh = dequantize(*quantize(v, cu, block), cu, v.shape)
    rel = lambda x, y: ((y - x).abs().mean() / x.abs().mean()).item()
    u, uh = m / (v.sqrt() + 1e-8), mh / (vh.sqrt() + 1e-8)
    return rel(m, mh), rel(v, vh), ((vh == 0) & (v != 0)).float().mean().item(), rel(u, uh)


quant = {}
for pname in ("transformer.wte.weight", "transformer.h.1.attn.c_attn.weight"):
    p = dict(tiny.named_parameters())[pname]
    m_true, v_true = adamw.state[p]["exp_avg"], adamw.state[p]["exp_avg_sq"]
    whole = m_true.numel()
    print(f"\n{pname} 的状态：{tuple(m_true.shape)}，{whole:,} 个数；v 的最大值 / 中位数 = "
          f"{(v_true.max() / v_true.median()).item():.1e}")
    print(pad("表示", 28), pad("m 相对误差", 12), pad("v 相对误差", 12), pad("v 被量化成 0", 14), "更新方向相对误差")
    for label, cs, cu, block in [("线性码表，整张量一个 absmax", LINEAR_S, LINEAR_U, whole),
                                 ("动态码表，整张量一个 absmax", SIGNED, UNSIGNED, whole),
                                 ("线性码表，每 2048 个一块", LINEAR_S, LINEAR_U, 2048),
                                 ("动态码表，每 2048 个一块", SIGNED, UNSIGNED, 2048)]:
        em, ev, zero, eu = errors(m_true, v_true, cs, cu, block)
        print(pad(label, 28), pad(f"{em:.4f}", 12), pad(f"{ev:.4f}", 12), pad(f"{zero:.1%}", 14), f"{eu:.4g}")
        if pname == "transformer.wte.weight":
            key = ("dyn" if cs is SIGNED else "lin") + ("_block" if block == 2048 else "_whole")
            quant[key] = eu
            publish(f"quant_{key}_zero", zero, fmt="{:.1%}")
            publish(f"quant_{key}_update_err", eu, fmt="{:.4g}")
            if cs is SIGNED:
                publish(f"quant_{key}_update_err_pct", eu, fmt="{:.1%}")
    if pname == "transformer.wte.weight":
        publish("wte_v_max_over_median", f"{(v_true.max() / v_true.median()).item():.1e}".replace("e+0", " \\times 10^").replace("e+", " \\times 10^"))
        publish("quant_block_gain", 1 - quant["dyn_block"] / quant["dyn_whole"], fmt="{:.0%}")

# %% [markdown]
# 相对误差是 $\overline{|\hat{x} - x|} / \overline{|x|}$。只看 $m$、$v$ 自身的平均误差，几种表示差别不大；要看的是最后一列，Adam 真正用到的更新方向 $m / (\sqrt{v} + \epsilon)$。二阶矩 $v$ 是梯度的平方，最大值和中位数差好几个数量级：线性码表把 $[0, \text{absmax}]$ 均分成 255 份，小于 $\text{absmax}/510$ 的数全被量化成 0，分母 $\sqrt{v}$ 变成 0，更新被放大到 $m/\epsilon$，更新方向的误差是原值的几百上千倍。动态码表在 0 附近有很多码值，没有一个 $v$ 变成 0；再分块，每块的 absmax 只管 2048 个数，误差又小一些。
#
# 误差会不会在训练中累积？下面手写一个“8-bit AdamW”：状态以 uint8 码 + 每块一个 FP32 absmax 保存，每步先反量化、做和 `torch.optim.AdamW` 相同的更新，再量化回去。用它和 FP32 的 AdamW 在 `tiny` 上各训练 12 步，比较损失。（bitsandbytes 默认只对元素数不少于 4096 的参数用 8 位状态，这里照做。）

# %%
class HandAdamW8bit:
    """教学用：分块动态量化的 AdamW（状态 = uint8 码 + 每 2048 个数一个 FP32 absmax）。"""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, block=2048, min_size=4096):
        self.params, self.lr, self.betas, self.eps, self.wd = list(params), lr, betas, eps, weight_decay
        self.block, self.min_size, self.t, self.state = block, min_size, 0, {}

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p in self.params:
            g = p.grad
            s = self.state.get(p)
            if s is None:
                m, v = torch.zeros_like(p), torch.zeros_like(p)
            elif s["q"]:
                m = dequantize(s["m"], s["am"], SIGNED, p.shape)
                v = dequantize(s["v"], s["av"], UNSIGNED, p.shape)
            else:
                m, v = s["m"], s["v"]
            p.mul_(1 - self.lr * self.wd)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, v.sqrt() / math.sqrt(bc2) + self.eps, value=-self.lr / bc1)
            if p.numel() >= self.min_size:
                qm, am = quantize(m, SIGNED, self.block)
                qv, av = quantize(v, UNSIGNED, self.block)
                self.state[p] = dict(q=True, m=qm, am=am, v=qv, av=av)
            else:
                self.state[p] = dict(q=False, m=m, v=v)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def state_bytes(self):
        return sum(t.numel() * t.element_size() for s in self.state.values() for t in s.values() if torch.is_tensor(t))


def train(make_opt, steps=12):
    torch.manual_seed(0)
    net = build_model("tiny")
    net.train()
    opt = make_opt(net.parameters())
    losses = []
    for _ in range(steps):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, opt


l32, o32 = train(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
l8, o8 = train(lambda ps: HandAdamW8bit(ps, lr=1e-3))
n_tiny = sum(p.numel() for p in build_model("tiny").parameters())
s32 = sum(v.numel() * v.element_size() for s in o32.state.values() for v in s.values())
print(pad("步", 6), pad("FP32 AdamW 损失", 18), "8-bit AdamW（手写）损失")
for i in (0, 3, 7, 11):
    print(pad(str(i + 1), 6), pad(f"{l32[i]:.4f}", 18), f"{l8[i]:.4f}")
print(f"\ntiny 共 {n_tiny:,} 个参数；状态字节：FP32 AdamW {s32:,}（{s32 / n_tiny:.3f} 字节/参数），"
      f"手写 8-bit {o8.state_bytes():,}（{o8.state_bytes() / n_tiny:.3f} 字节/参数）")
psmall = 124_439_808
print(f"换算到 GPT-2 small（{psmall:,} 个参数，全部按 8 位计）：每参数 2 + 2×4/2048 字节 → "
      f"{mib(psmall * (2 + 8 / 2048)):.1f} MiB，而 FP32 AdamW 是 {mib(psmall * 8):.1f} MiB（算术）")
publish("small_8bit_state_mib", mib(psmall * (2 + 8 / 2048)), fmt="{:.1f}")
publish("small_adamw_state_mib", mib(psmall * 8), fmt="{:.1f}")
publish("small_sgdm_state_mib", mib(psmall * 4), fmt="{:.1f}")
publish("tiny_fp32_bpp", s32 / n_tiny, fmt="{:.3f}")
publish("tiny_hand8_bpp", o8.state_bytes() / n_tiny, fmt="{:.3f}")

# %% [markdown]
# 两条损失曲线几乎重合：分块动态量化的误差没有在 12 步里累积成可见的差别（这只是一个小实验，不代表任何模型都如此；论文在大模型上的结论见正文）。`tiny` 的很多参数（LayerNorm、偏置、位置嵌入以外的小张量）不足 4096 个元素，仍按 FP32 保存，所以它的字节/参数高于 2。
#
# 真实项目里不用手写：bitsandbytes（本项目的依赖，它的 CPU 实现在模拟设备上也能跑）一行就够，`bnb.optim.AdamW8bit(model.parameters(), lr=...)`。下面用它在同样的数据上训练 12 步，再在模拟设备上量一次它的状态占多少显存。torchao 的 `torchao.optim.AdamW8bit`（还有 4 位的 `AdamW4bit`）要靠 `torch.compile`，在模拟设备的 dispatch mode 下不能运行，这里不演示。

# %%
import logging

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)   # 不打印它找不到可选 CPU 内核（kernels 包）的提示
import bitsandbytes as bnb  # noqa: E402

lb, ob = train(lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3))
# qmap1 / qmap2 are the optimizer's two shared 256-entry code tables, referenced from every parameter's
# state: count each storage once.
storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
            for s in ob.state.values() for v in s.values() if torch.is_tensor(v)}
sb = sum(storages.values())
print(pad("步", 6), pad("FP32 AdamW", 14), pad("手写 8-bit", 14), "bitsandbytes AdamW8bit")
for i in (0, 3, 7, 11):
    print(pad(str(i + 1), 6), pad(f"{l32[i]:.4f}", 14), pad(f"{l8[i]:.4f}", 14), f"{lb[i]:.4f}")
print(f"\nbitsandbytes 的状态（uint8 码、每块 absmax、全体参数共用的两张 256 项码表，小参数仍是 FP32；按存储去重）："
      f"{sb:,} 字节，{sb / n_tiny:.3f} 字节/参数")
publish("bnb_state_bpp", sb / n_tiny, fmt="{:.3f}")
for key, losses in (("fp32", l32), ("hand8", l8), ("bnb", lb)):
    publish(f"loss12_{key}", losses[11], fmt="{:.4f}")


def optimizer_state_on_device(make_opt):
    """One training step on the simulated device; the optimizer_state category afterwards."""
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        net = build_model("tiny")
        opt = make_opt(net.parameters())
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return dev.breakdown(at_peak=False)["optimizer_state"]


on_dev32 = optimizer_state_on_device(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
on_dev8 = optimizer_state_on_device(lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3))
print(f"模拟设备上的优化器状态：torch AdamW {mib(on_dev32):.2f} MiB，bitsandbytes AdamW8bit {mib(on_dev8):.2f} MiB"
      f"（{on_dev8 / on_dev32:.2f} 倍）")
publish("dev_state_fp32_mib", mib(on_dev32), fmt="{:.2f}")
publish("dev_state_bnb_mib", mib(on_dev8), fmt="{:.2f}")
publish("dev_state_ratio", on_dev8 / on_dev32, fmt="{:.2f}")

# %% [markdown]
# bitsandbytes 的损失与 FP32 AdamW 同样几乎重合；它的字节/参数比手写版还高一些，主要因为 bitsandbytes 0.50.2 的 8 位分块优化器每块只有 256 个数（`bitsandbytes/optim/optimizer.py` 里 `blocksize = 256`），absmax 比手写版的每块 2048 个多 8 倍。每个参数的状态里都有 `qmap1`、`qmap2` 两个键，但它们指向全体参数共用的两张 256 项码表，所以上面按存储去重后只算一次。

# %% [markdown]
# ## 4. 把 AdamW 的状态放到主存（练习 `ch19-offload` 的预演）
#
# ZeRO-Offload 的思路：显存里只留参数和梯度；FP32 的参数副本、$m$、$v$ 都在主存，Adam 的更新在 CPU 上做。每步的数据流是：梯度 显存 → 主存；主存里更新；新参数 主存 → 显存。
#
# `vramlab` 的设备提供了三个接口：`dev.to_host(t)`（模拟 `t.to("cpu")`，得到的副本不算显存）、`dev.to_device(t)`（拷回显存）、`with dev.host():`（里面新建的张量都在主存）。在真卡上，`to_host` 返回锁页内存里的 CPU 张量，`host()` 什么也不做（CPU 张量本来就在主存）。
#
# 规模取练习的 CI 规模：`gpt2-mini`（4 层，512 维），批大小 2，序列长度 64，真实张量，2 步（第 1 步热身，峰值取第 2 步）。三种做法：
#
# - **A 普通**：`torch.optim.AdamW(foreach=True)`，状态在显存；
# - **B 主存里的 torch AdamW**：主存里放一份参数副本，对它建一个 `torch.optim.AdamW`（练习参考答案的做法）；
# - **C 手写**：主存里放 FP32 主权重和 $m$、$v$，自己写 AdamW 的公式，逐个参数更新、逐个拷回。

# %% tags=["offload"]
B, T, STEPS = 2, 64, 2
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)


def make_batch(dev):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, get_preset("gpt2-mini").vocab, (B, T), generator=g).to(dev.torch_device) for _ in range(STEPS)]


def step_plain(model, opt, batch, dev, state):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def step_host_torch(model, opt, batch, dev, state):
    params = list(model.parameters())
    if "opt" not in state:                          # 第一次：主存里的参数副本和 AdamW
        with dev.host():
            state["hp"] = [dev.to_host(p) for p in params]
            state["opt"] = torch.optim.AdamW(state["hp"], **HYPER, foreach=False)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for hp, p in zip(state["hp"], params):
        hp.grad = dev.to_host(p.grad)               # 梯度 显存 → 主存
        p.grad = None                               # 显存里的梯度立刻释放
    with dev.host():
        state["opt"].step()                         # 状态和临时张量都在主存
        state["opt"].zero_grad(set_to_none=True)
    with torch.no_grad():
        for hp, p in zip(state["hp"], params):
            p.copy_(dev.to_device(hp))              # 新参数 主存 → 显存
    return loss.item()


def step_host_hand(model, opt, batch, dev, state):
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    params = list(model.parameters())
    if "w" not in state:
        with dev.host():
            state["w"] = [dev.to_host(p) for p in params]             # FP32 主权重
            state["m"] = [torch.zeros_like(w) for w in state["w"]]    # 一阶矩
            state["v"] = [torch.zeros_like(w) for w in state["w"]]    # 二阶矩
            state["t"] = 0
    state["t"] += 1
    t = state["t"]
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    with torch.no_grad():
        for p, w, m, v in zip(params, state["w"], state["m"], state["v"]):
            g = dev.to_host(p.grad)
            p.grad = None
            with dev.host():
                w.mul_(1 - lr * wd)                                   # AdamW 的解耦权重衰减
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
                w.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
            p.copy_(dev.to_device(w))
    return loss.item()


results = {}
for key, label, fn in [("A", "A 普通（状态在显存）", step_plain),
                       ("B", "B 主存里的 torch AdamW", step_host_torch),
                       ("C", "C 手写 AdamW（主存）", step_host_hand)]:
    with vramlab.open_device("auto") as dev:
        model = build_model("gpt2-mini", device=dev.torch_device, seed=0)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), **HYPER, foreach=True)
        batches, state, losses = make_batch(dev), {}, []
        for i, batch in enumerate(batches):
            if i == 1:
                dev.reset_peak()                    # 第 1 步热身（AdamW 在第一次 step 时才创建状态）
            losses.append(fn(model, opt, batch, dev, state))
        results[key] = dict(label=label, losses=losses, peak=dev.max_allocated(), bd=dev.breakdown(),
                            where=dev.snapshot()["peak_where"], timeline=dev.snapshot()["timeline"],
                            params=[p.detach().to("cpu").clone() for p in model.parameters()])

n_mini = sum(p.numel() for p in results["A"]["params"])
print(f"gpt2-mini：{n_mini:,} 个参数，FP32 参数 {mib(4 * n_mini):.1f} MiB，AdamW 状态 {mib(8 * n_mini):.1f} MiB\n")
print(pad("做法", 26), pad("稳态峰值 MiB", 14), pad("与 A 之比", 10), pad("各步损失", 28), "参数与 A 的最大绝对差")
for key, r in results.items():
    diff = max((a - b).abs().max().item() for a, b in zip(r["params"], results["A"]["params"]))
    print(pad(r["label"], 26), pad(f"{mib(r['peak']):.1f}", 14), pad(f"{r['peak'] / results['A']['peak']:.2f}", 10),
          pad(" ".join(f"{x:.4f}" for x in r["losses"]), 28), f"{diff:.2e}")
    if key == "C":
        publish("offload_c_vs_a_max_diff", f"{diff:.2e}")
print()
for cat in ("parameters", "gradients", "optimizer_state", "temporaries", "cuda_overhead"):
    publish(f"offload_a_{cat}_mib", mib(results["A"]["bd"].get(cat, 0)), fmt="{:.1f}")
publish("offload_bc_ratio", max(results["B"]["peak"], results["C"]["peak"]) / results["A"]["peak"], fmt="{:.2f}")
for key, r in results.items():
    parts = "，".join(f"{k} {mib(v):.1f}" for k, v in r["bd"].items() if v)
    print(f"{key} 峰值位置：{r['where']}\n  组成（MiB）：{parts}")

# %% [markdown]
# 三种做法的损失一样，参数的差别在 FP32 舍入误差的量级（C 的运算顺序和 `foreach` 实现略有不同）。三种做法的峰值都出现在反向末尾（`EmbeddingBackward0` 里的 `add`）：GPT-2 的词嵌入和输出层共用一个权重，它的两份梯度（来自 `lm_head` 和嵌入层）在这里相加，短暂地同时存在三份词嵌入大小的张量。A 在这一刻多了常驻显存的 AdamW 状态（两份参数大小），这正是 A 与 B、C 峰值之差；A 在 `optimizer.step()` 里还有 `foreach` 的临时张量，但那时激活值和反向的中间结果已经释放，step 的高台比反向末尾略低（见下图）。B 和 C 把状态和更新都放在主存，step 时显存反而下降：梯度搬走一个就释放一个。注意 B、C 的分类里没有“gradients”一行：梯度只在设备上的优化器 step 时才被贴上这个标签，这里设备上没有优化器，梯度记在“temporaries”里。
#
# 下面把三种做法的已分配显存随时间的变化画出来（横轴是分配/释放事件的序号，不是时间）。

# %%
fig, ax = plt.subplots(figsize=(9, 3.8))
for key, r in results.items():
    ys = [mib(e["allocated"]) for e in r["timeline"]]
    ax.plot(range(len(ys)), ys, lw=1, label=r["label"] if ZH else {"A": "A plain", "B": "B torch AdamW on host",
                                                                   "C": "C hand-written AdamW on host"}[key])
ax.set_xlabel("分配/释放事件序号（2 个训练步）" if ZH else "allocation event (2 training steps)")
ax.set_ylabel("已分配显存 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("gpt2-mini，批大小 2，序列长度 64：AdamW 状态在显存 vs 在主存" if ZH
             else "gpt2-mini, batch 2, seq 64: AdamW state on device vs in host memory")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### 代价：每步过一遍 PCIe
#
# 卸载省下的是显存，花掉的是 PCIe 带宽和 CPU 算力。每步至少要把梯度搬下去、把新参数搬上来。下面按 FP32（本节的做法）和 ZeRO-Offload 的 16 位梯度、16 位参数两种情况，算出每步的传输量和 PCIe 4.0 x16 单向约 31.5 GB/s（第 1 章的算式）下的理论最短时间。这是算术，不是测量。

# %%
PCIE4 = 31.5e9
print(pad("模型", 16), pad("参数量", 16), pad("每步传输（单向）", 28), "PCIe 4.0 x16 单向理论时间")
for name, n in [("gpt2-mini", n_mini), ("GPT-2 small", psmall), ("7B", 7_000_000_000)]:
    for bytes_per, tag in ((4, "FP32"), (2, "16 位")):
        one_way = n * bytes_per
        print(pad(name, 16), pad(f"{n:,}", 16), pad(f"{tag}：{one_way / 1e9:.3f} GB", 28), f"{one_way / PCIE4 * 1e3:,.1f} ms")
        if bytes_per == 2 and name in ("GPT-2 small", "7B"):
            key = "small" if name == "GPT-2 small" else "7b"
            publish(f"pcie_{key}_gb", one_way / 1e9, fmt="{:.3f}" if key == "small" else "{:.0f}")
            publish(f"pcie_{key}_ms", one_way / PCIE4 * 1e3, fmt="{:.1f}" if key == "small" else "{:.0f}")
