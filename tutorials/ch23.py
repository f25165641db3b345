# %% [markdown]
# # 第 23 章 动手实践：蒸馏时教师、logits 和特征各占多少显存
#
# 这份教程配合[第 23 章 知识蒸馏与显存](ch23.md)，用 `vramlab` 回答五个问题：
#
# 1. 教师（teacher）和学生（student）一起放在卡上，账本里有哪几项？教师用 FP32、BF16、INT8 存各要多少？logits 每个 token 多大？（算术）
# 2. 一个在线蒸馏步里，教师在 autograd 下前向（起始代码的写法）和在 `torch.no_grad()` / `torch.inference_mode()` 下前向，峰值和组成差多少？（GPT-2 small 当教师、`gpt2-mini` 当学生，FakeTensorMode）
# 3. 两种写法的损失、学生的更新是否完全一样？教师会不会被改动？`eval()` 为什么要加？（真实张量）
# 4. 两个模型的 $[b, s, V]$ logits 加上 KL 散度的临时张量有多大？按序列分块算 KL、离线缓存教师的 top-k logits 各省多少？
# 5. 特征蒸馏（FitNets 的提示层）和 logit 蒸馏各要在显存里留什么？
#
# 没有 GPU 时，显存在 CPU 上的**模拟设备**里统计（`vramlab.open_device("auto")` 自动选择；有 NVIDIA GPU 时同样的代码在真卡上测量）。第 2、4、5 节的 GPT-2 small 在模拟设备上用 FakeTensorMode（只有形状、没有数据）运行；第 3 节和第 4 节的数值核对用真实张量跑一对小模型。

# %%
import datetime
import time

import torch
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

import vramlab
from vramlab.display import banner, mib, pad
from vramlab.models import build_model, count_params, make_config
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()     # 不打印与本章无关的配置提示
ON_GPU = banner()
FAKE = not ON_GPU          # 第 2、4、5 节：模拟设备上用 FakeTensorMode
T0 = time.process_time()
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 账本：教师、学生和 logits
#
# 在线蒸馏（online distillation）的一步里，卡上同时有：
#
# - **学生的模型状态**：参数、梯度、AdamW 的两个矩（FP32 下每参数 16 字节，第 19 章）；
# - **教师的参数**：只做前向，不需要梯度和优化器状态，每参数 4 字节（FP32）、2 字节（BF16）或约 1 字节（INT8 仅权重）；
# - **两份 logits**：学生和教师各一个 $[b, s, V]$，再加上 softmax / log-softmax 和 KL 散度的临时张量；
# - **学生的激活值**；教师的激活值只有在 autograd 开着的时候才会被保存下来。
#
# 下面先把参数这一块算清楚（`count_params` 在 meta 设备上建模型，不占内存），再算 logits 每个 token 多大。

# %%
V = 50257
print(pad("模型", 14), pad("参数量", 14), pad("FP32 MiB", 10), pad("BF16 MiB", 10), pad("INT8 MiB", 10), "作学生：16 字节/参数 MiB")
for name in ("gpt2-mini", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"):
    n = count_params(name)
    print(pad(name, 14), pad(f"{n:,}", 14), pad(f"{mib(4 * n):.1f}", 10), pad(f"{mib(2 * n):.1f}", 10),
          pad(f"{mib(n):.1f}", 10), f"{mib(16 * n):.1f}")
    key = name.split("-")[1]
    publish(f"par_{key}_n", f"{n:,}")
    for what, bpp in (("fp32", 4), ("bf16", 2), ("int8", 1), ("student", 16)):
        publish(f"par_{key}_{what}_mib", mib(bpp * n), fmt="{:.1f}")
print(f"\n词表 V = {V}：每个 token 的 logits 在 FP32 下是 {V * 4:,} 字节（{V * 4 / 1024:.1f} KiB），BF16 下减半；")
for b, s in ((4, 256), (8, 512), (8, 2048)):
    print(f"  b={b}, s={s}：一份 [b, s, V] FP32 logits = {mib(b * s * V * 4):,.1f} MiB")
    publish(f"logits_b{b}_s{s}_mib", mib(b * s * V * 4), fmt="{:.1f}")

# %% [markdown]
# 表里的“INT8”只算每个权重 1 字节，没算每个输出通道的缩放系数（第 22 章），也没算嵌入层是否量化；它是一个下限。注意最后一列：同一个模型当学生要 16 字节/参数，当教师只要 2–4 字节/参数。这就是为什么教师可以比学生大好几倍，卡上还放得下——前提是教师真的只做前向。

# %% [markdown]
# ## 2. 教师在 autograd 下 vs 在 `no_grad` 下
#
# 一个 logit 蒸馏步：教师和学生对同一批 token 做前向，损失是温度 $T$ 下两个分布的 KL 散度乘以 $T^2$（Hinton 等人，2015），只有学生被 AdamW 更新。下面的 `distill_step_*` 与本章评分练习 `ch23-distill` 的参数相同：`(student, teacher, optimizer, batch, device)`。（练习的函数多一个 `temperature` 参数，损失里还加了一半学生自己的交叉熵，并返回 Python `float`；这里为了在 FakeTensorMode 下也能运行，返回 `detach()` 之后的损失张量，有数值时调用者再 `.item()`。）
#
# - **A 起始代码**：直接 `teacher(...)`。教师的参数默认 `requires_grad=True`，autograd 于是为教师的每一层保存激活值，`loss.backward()` 还会一路反传进教师、算出教师每个参数的梯度，并一直挂在 `p.grad` 上。
# - **B** 只把教师的参数设成 `requires_grad_(False)`。
# - **C 推荐写法**：`teacher.eval()`，教师前向放进 `torch.no_grad()`。
# - **D** 同 C，但用 `torch.inference_mode()`。
# - **E** 同 C，教师以 BF16 存放（`build_model(..., dtype=torch.bfloat16)`），logits 转回 FP32 再算 KL。
#
# 教师是 GPT-2 small（1.24 亿参数），学生是 `gpt2-mini`（3887 万参数），两者词表相同（logit 蒸馏要求逐个词比较两个分布，词表必须一致）。批大小 4、序列长度 256，跑 2 步，峰值取第 2 步（第 1 步 AdamW 才创建状态）。

# %%
TEMP = 2.0


def kd_loss(s_logits, t_logits, T=TEMP):
    """Hinton 的软目标损失：KL(p_T || q_T) · T²，按 token 平均（batchmean 作用在 [N, V] 上）。"""
    s = F.log_softmax(s_logits.flatten(0, 1).float() / T, dim=-1)
    t = F.log_softmax(t_logits.flatten(0, 1).float() / T, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * T * T


def _finish(loss, optimizer):
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()          # 真实张量时调用者再 .item()；FakeTensorMode 下没有数值


def distill_step_autograd(student, teacher, optimizer, batch, device):      # A：起始代码
    t_logits = teacher(input_ids=batch).logits
    s_logits = student(input_ids=batch).logits
    return _finish(kd_loss(s_logits, t_logits), optimizer)


def distill_step_frozen(student, teacher, optimizer, batch, device):        # B
    teacher.requires_grad_(False)
    t_logits = teacher(input_ids=batch).logits
    s_logits = student(input_ids=batch).logits
    return _finish(kd_loss(s_logits, t_logits), optimizer)


def distill_step_nograd(student, teacher, optimizer, batch, device):        # C：推荐
    teacher.eval()
    with torch.no_grad():
        t_logits = teacher(input_ids=batch).logits
    s_logits = student(input_ids=batch).logits
    return _finish(kd_loss(s_logits, t_logits), optimizer)


def distill_step_inference(student, teacher, optimizer, batch, device):     # D
    teacher.eval()
    with torch.inference_mode():
        t_logits = teacher(input_ids=batch).logits
    s_logits = student(input_ids=batch).logits
    return _finish(kd_loss(s_logits, t_logits), optimizer)


def run(step_fn, teacher="gpt2-small", student="gpt2-mini", b=4, s=256, teacher_dtype=None, steps=2, fake=FAKE):
    """在一个新设备上建教师和学生，跑 steps 步（第 1 步热身），返回峰值、组成、教师梯度字节数等。"""
    with vramlab.open_device("auto", fake=fake) as dev:
        t_model = build_model(teacher, device=dev.torch_device, seed=1, dtype=teacher_dtype)
        s_model = build_model(student, device=dev.torch_device, seed=0)
        t_model.train()
        s_model.train()
        opt = torch.optim.AdamW(s_model.parameters(), lr=1e-4)
        if fake:                                   # FakeTensorMode：只有形状
            batches = [torch.randint(0, V, (b, s), device=dev.torch_device) for _ in range(steps)]
        else:
            gen = torch.Generator().manual_seed(0)
            batches = [torch.randint(0, V, (b, s), generator=gen).to(dev.torch_device) for _ in range(steps)]
        losses = []
        for i, batch in enumerate(batches):
            if i == 1:
                dev.reset_peak()
            losses.append(step_fn(s_model, t_model, opt, batch, dev))
        snap = dev.snapshot()
        t_grad = sum(p.grad.numel() * p.grad.element_size() for p in t_model.parameters() if p.grad is not None)
        return dict(peak=dev.max_allocated(), bd=snap["breakdown"], where=snap["peak_where"], t_grad=t_grad,
                    timeline=snap["timeline"], losses=None if fake else [x.item() for x in losses])


VARIANTS = [("A autograd（起始代码）", distill_step_autograd, None),
            ("B requires_grad_(False)", distill_step_frozen, None),
            ("C no_grad + eval", distill_step_nograd, None),
            ("D inference_mode + eval", distill_step_inference, None),
            ("E 同 C，教师 BF16", distill_step_nograd, torch.bfloat16)]
main = {}
for label, fn, dt in VARIANTS:
    main[label] = run(fn, teacher_dtype=dt)

CATS = [("parameters", "参数"), ("gradients", "梯度"), ("optimizer_state", "优化器状态"),
        ("activations", "激活值"), ("temporaries", "临时张量"), ("cuda_overhead", "cuBLAS")]
base = main["A autograd（起始代码）"]["peak"]
print("教师 gpt2-small，学生 gpt2-mini，b=4，s=256，稳态峰值时刻的组成（MiB）\n")
print(pad("写法", 26), pad("峰值", 9), pad("与 A 之比", 10), *[pad(zh, 11) for _, zh in CATS], "其中教师梯度")
for label, r in main.items():
    print(pad(label, 26), pad(f"{mib(r['peak']):.1f}", 9), pad(f"{r['peak'] / base:.2f}", 10),
          *[pad(f"{mib(r['bd'].get(k, 0)):.1f}", 11) for k, _ in CATS], f"{mib(r['t_grad']):.1f}")
print()
for label, r in main.items():
    print(pad(label, 26), "峰值位置：", r["where"])
for label, r in main.items():
    key = label[0].lower()
    publish(f"main_{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"main_{key}_ratio", r["peak"] / base, fmt="{:.2f}")
    publish(f"main_{key}_act_mib", mib(r["bd"].get("activations", 0)), fmt="{:.1f}")
    publish(f"main_{key}_temp_mib", mib(r["bd"].get("temporaries", 0)), fmt="{:.1f}")
    publish(f"main_{key}_tgrad_mib", mib(r["t_grad"]), fmt="{:.1f}")
A, C, E = main["A autograd（起始代码）"], main["C no_grad + eval"], main["E 同 C，教师 BF16"]
publish("main_a_minus_c_mib", round(mib(A["peak"]), 1) - round(mib(C["peak"]), 1), fmt="{:.0f}")
publish("main_a_minus_c_act_mib", round(mib(A["bd"]["activations"]), 1) - round(mib(C["bd"]["activations"]), 1), fmt="{:.0f}")
publish("main_c_minus_e_param_mib", mib(C["bd"]["parameters"] - E["bd"]["parameters"]), fmt="{:.0f}")
publish("main_a_tl_max_mib", max(mib(e["allocated"]) for e in A["timeline"]), fmt="{:.0f}")
publish("main_c_tl_max_mib", max(mib(e["allocated"]) for e in C["timeline"]), fmt="{:.0f}")

# %% [markdown]
# 逐列读：
#
# - **峰值时刻**：B–E 的峰值出现在前向末尾算 KL 的时候（`mul`，此时两份 logits 和 KL 的临时张量都在），A 的峰值出现在反向刚开始。这两个时刻上一步的学生梯度都已经被 `zero_grad(set_to_none=True)` 释放、这一步的还没算出来，所以“梯度”一列是 0。
# - **参数**：A–D 都是教师 FP32 的 474.7 MiB 加学生 148.3 MiB；E 的教师是 BF16，参数少了 231.3 MiB，接近教师 FP32 与 BF16 之差 237.4 MiB。E 的激活值也少了约 99 MiB：教师的 logits 是 BF16 的。
# - **优化器状态**：只属于学生（AdamW 的两个矩），五种写法一样。
# - **激活值**：A 比 C 多出约 1016 MiB，这是教师为反向保存的中间结果。C、D 里教师的中间结果用完即释放，激活值只剩学生的，加上两份 logits。
# - **临时张量**：A 有 876.2 MiB，其中 474.7 MiB 是**上一步**留下的教师梯度。模拟设备只把优化器管辖的参数的梯度记作“梯度”，教师的梯度没有优化器，落在这一列；最后一列把它单独列了出来，正好是教师 FP32 参数的大小。
# - **B 与 C 一样省**：输入是整数 token，教师的参数又都不要梯度，autograd 根本不会为教师建计算图。但 B 依赖“参数都冻结了”这个前提，一旦有人在别处把教师参数重新设成可训练（例如加载检查点、包上 peft），它就悄悄变回 A；`no_grad` 是显式的、不依赖前提的写法。
#
# 下面把 A 和 C 的已分配显存随时间的变化画出来（横轴是分配/释放事件的序号，2 个训练步）。

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框
fig, ax = plt.subplots(figsize=(9, 3.8))
for label, en in (("A autograd（起始代码）", "A teacher under autograd (starter)"), ("C no_grad + eval", "C teacher under no_grad + eval")):
    ys = [mib(e["allocated"]) for e in main[label]["timeline"]]
    ax.plot(range(len(ys)), ys, lw=1, label=label if ZH else en)
ax.set_xlabel("分配/释放事件序号（2 个训练步）" if ZH else "allocation event (2 training steps)")
ax.set_ylabel("已分配显存 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("教师 GPT-2 small → 学生 gpt2-mini，b=4，s=256" if ZH else "teacher GPT-2 small -> student gpt2-mini, b=4, s=256")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 两条曲线开头相同的一段是建模型（教师和学生的参数）。之后的区别：A 里教师的前向是一段一路上升的斜坡，每一层的激活值都被留给反向；C 里教师的前向是一段平的锯齿，每一层的输出用完就释放，最后只剩 logits。A 的反向在学生之后还要穿过整个教师，并在末尾留下 474.7 MiB 的教师梯度，而且它们**不会消失**：没有优化器去清零，它们一直挂在教师的 `p.grad` 上，第 2 步从一个更高的台阶起跳（每一步还把新梯度累加进去）。

# %% [markdown]
# ## 3. 真实张量核对：损失、学生更新、教师都不变
#
# FakeTensorMode 只有形状、没有数值。下面用真实张量跑一对小模型：教师是 `gpt2-mini`（4 层，512 维），学生是 `tiny` 的形状（2 层，128 维）但用 GPT-2 的词表（蒸馏要求词表一致），批大小 2、序列长度 32，各跑 2 步。核对三件事：A 与 C 的每步损失相同、学生参数相同；教师的参数没有被改；A 在教师上留下了多少梯度。

# %% tags=["small"]
import copy


def tiny_student():
    cfg = make_config("tiny")
    cfg.vocab_size, cfg.bos_token_id, cfg.eos_token_id = V, V - 1, V - 1    # tiny 的形状，GPT-2 的词表
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


TEACHER_SMALL = build_model("gpt2-mini", seed=1)     # 只建一次（在主存里），每次实验搬上设备
STUDENT_INIT = tiny_student()


def run_small(step_fn, steps=2, b=2, s=32):
    with vramlab.open_device("auto") as dev:
        teacher = TEACHER_SMALL.to(dev.torch_device)
        student = copy.deepcopy(STUDENT_INIT).to(dev.torch_device)   # 每次从同一个初始学生开始
        dev.adopt(teacher, student)                 # 模拟设备：把已有的参数记到设备账上（真卡上 .to() 已经做了）
        teacher.train().requires_grad_(True)
        student.train()
        before = [p.detach().clone() for p in teacher.parameters()]
        opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, V, (b, s), generator=gen).to(dev.torch_device) for _ in range(steps)]
        losses = []
        for i, batch in enumerate(batches):
            if i == 1:
                dev.reset_peak()
            losses.append(step_fn(student, teacher, opt, batch, dev).item())
        changed = max((p.detach() - q).abs().max().item() for p, q in zip(teacher.parameters(), before))
        t_grad = sum(p.grad.numel() * 4 for p in teacher.parameters() if p.grad is not None)
        result = dict(losses=losses, peak=dev.max_allocated(), bd=dev.breakdown(), changed=changed, t_grad=t_grad,
                      student=[p.detach().to("cpu").clone() for p in student.parameters()])
        del before
    teacher.zero_grad(set_to_none=True)              # 把 A 留下的教师梯度清掉，下一个实验从干净的教师开始
    return result


small = {label: run_small(fn) for label, fn in (("A autograd（起始代码）", distill_step_autograd),
                                                ("C no_grad + eval", distill_step_nograd))}
n_student = sum(p.numel() for p in STUDENT_INIT.parameters())
print(f"学生（tiny 形状 + GPT-2 词表）：{n_student:,} 个参数；教师 gpt2-mini：{count_params('gpt2-mini'):,} 个参数\n")
ref = small["A autograd（起始代码）"]
print(pad("写法", 26), pad("各步损失", 20), pad("学生参数与 A 的最大差", 22), pad("教师参数最大变化", 18),
      pad("教师梯度 MiB", 13), "稳态峰值 MiB")
for label, r in small.items():
    diff = max((a - b).abs().max().item() for a, b in zip(r["student"], ref["student"]))
    print(pad(label, 26), pad(" ".join(f"{x:.5f}" for x in r["losses"]), 20), pad(f"{diff:.1e}", 22),
          pad(f"{r['changed']:.1e}", 18), pad(f"{mib(r['t_grad']):.1f}", 13), f"{mib(r['peak']):.1f}")
workspace = small["C no_grad + eval"]["bd"].get("cuda_overhead", 0)
print(f"\n峰值之比 C / A = {small['C no_grad + eval']['peak'] / ref['peak']:.2f}（其中 cuBLAS 工作区共 {mib(workspace):.0f} MiB 两边都有）")
publish("small_n_student", f"{n_student:,}")
publish("small_workspace_mib", mib(workspace), fmt="{:.0f}")
for label, r in small.items():
    key = label[0].lower()
    publish(f"small_{key}_losses", "、".join(f"{x:.5f}" for x in r["losses"]))
    publish(f"small_{key}_tgrad_mib", mib(r["t_grad"]), fmt="{:.1f}")
    publish(f"small_{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"small_{key}_teacher_changed", f"{r['changed']:.1e}")
publish("small_student_maxdiff", f"{max((a - b).abs().max().item() for a, b in zip(small['C no_grad + eval']['student'], ref['student'])):.1e}")

# %% [markdown]
# 两种写法的损失和学生的参数逐位相同：教师前向在不在 autograd 下，算出来的 logits 一样，对学生的梯度也一样。A 里教师参数没变（没有优化器去更新它），但它的梯度一直占着显存；如果有人图省事把教师的参数也交给了优化器，或者在别处调用了一次 `optimizer.step()` 覆盖到教师，教师就会被悄悄改掉。
#
# `eval()` 的作用在这对模型上看不出来：`vramlab` 的预设默认 dropout 为 0。真实的预训练模型（GPT-2 的配置里 `resid_pdrop` 等是 0.1）在 `train()` 模式下每次前向都随机丢掉一部分激活值，教师给的“软目标”就成了带噪声的目标，而且两次前向结果不同。下面把教师的 dropout 设成 0.1 看一下：

# %%
noisy = TEACHER_SMALL.to("cpu")                  # 只比较数值，在 CPU 上算
for m in noisy.modules():
    if isinstance(m, torch.nn.Dropout):
        m.p = 0.1                                  # 相当于配置里 resid_pdrop = embd_pdrop = attn_pdrop = 0.1
ids = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(2))
with torch.no_grad():
    noisy.train()
    torch.manual_seed(0)
    a, b = noisy(input_ids=ids).logits, noisy(input_ids=ids).logits
    noisy.eval()
    c, d = noisy(input_ids=ids).logits, noisy(input_ids=ids).logits
for m in noisy.modules():
    if isinstance(m, torch.nn.Dropout):
        m.p = 0.0                                  # 改回去
print(f"dropout=0.1 的教师：train() 模式下两次前向的 logits 最大差 {(a - b).abs().max().item():.3f}；"
      f"eval() 模式下 {(c - d).abs().max().item():.1e}")
publish("dropout_train_diff", (a - b).abs().max().item(), fmt="{:.3f}")
publish("dropout_eval_diff", f"{(c - d).abs().max().item():.1e}")

# %% [markdown]
# ## 4. logits 与 KL 的临时张量；分块 KL；top-k 缓存
#
# ### 4.1 KL 损失本身要多少显存
#
# 把两个模型都拿掉，只看损失：设备上有学生的 logits $z_s$（要梯度）和教师的 logits $z_t$，形状都是 $[N, V]$（$N = b \cdot s$ 个 token），算 KL 并反向。比较三种写法（FakeTensorMode，$N = 1024$，$V = 50257$，一份 logits 196.3 MiB）：
#
# - `softmax` 目标：`F.kl_div(F.log_softmax(zs/T), F.softmax(zt/T), reduction="batchmean")`；
# - `log_target=True`：教师也给 log-softmax；
# - 分块：每次 128 行，每块用 `checkpoint` 包起来，前向不保存这一块的中间结果，反向时重算。
#
# 表里的“额外峰值”是峰值减去两份输入 logits（单位：一份 logits 的大小）。

# %%
N, CH = 1024, 128


def kl_softmax_target(zs, zt, T=TEMP):
    return F.kl_div(F.log_softmax(zs / T, -1), F.softmax(zt / T, -1), reduction="batchmean") * T * T


def kl_log_target(zs, zt, T=TEMP):
    return F.kl_div(F.log_softmax(zs / T, -1), F.log_softmax(zt / T, -1), reduction="batchmean", log_target=True) * T * T


def kl_chunked(zs, zt, T=TEMP, chunk=CH):
    def part(a, b):
        return F.kl_div(F.log_softmax(a / T, -1), F.log_softmax(b / T, -1), reduction="sum", log_target=True)
    total = 0
    for i in range(0, zs.shape[0], chunk):
        total = total + checkpoint(part, zs[i:i + chunk], zt[i:i + chunk], use_reentrant=False)
    return total / zs.shape[0] * T * T


one = N * V * 4
print(pad("KL 的写法", 22), pad("峰值 MiB", 10), pad("额外峰值 MiB", 14), pad("= 几份 logits", 15), "峰值位置")
tops = {}
for label, fn in (("softmax 目标", kl_softmax_target), ("log_target=True", kl_log_target), (f"分块（每块 {CH} 行）", kl_chunked)):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        zs = torch.randn(N, V, device=dev.torch_device, requires_grad=True)
        zt = torch.randn(N, V, device=dev.torch_device)
        dev.reset_peak()
        fn(zs, zt).backward()
        extra = dev.max_allocated() - 2 * one
        tops[label] = dev.top_allocations(7)
        print(pad(label, 22), pad(f"{mib(dev.max_allocated()):.1f}", 10), pad(f"{mib(extra):.1f}", 14),
              pad(f"{extra / one:.2f}", 15), dev.snapshot()["peak_where"])
        key = {"softmax 目标": "softmax", "log_target=True": "logtarget"}.get(label, "chunked")
        publish(f"kl_{key}_copies", extra / one, fmt="{:.2g}")
publish("kl_one_mib", mib(one), fmt="{:.1f}")
for label in ("log_target=True", f"分块（每块 {CH} 行）"):
    print(f"\n{label}：峰值时刻最大的几个张量")
    for a in tops[label]:
        if a["bytes"] > one // 2:
            print("   ", pad(f"{mib(a['bytes']):.1f} MiB", 12), a["op"], "@", a["where"])

# %% [markdown]
# 不分块时，KL 一项在两份输入 logits（两个 `randn`）之外还要 5 份同样大小的张量，峰值在前向：学生和教师的 log-softmax（学生的要留给反向）、`kl_div` 内部的差 $\log p - \log q$（`sub`）、$p = \exp(\log p)$（`exp`）和逐元素的 KL 项（`mul`）。`softmax` 目标和 `log_target=True` 两种写法一样大。
#
# 分块之后，前向的这些临时张量只有一块那么大，额外峰值降到 3 份，但它们换了地方：全在反向的 `SliceBackward0` 里。每一块的梯度经过切片的反向时，先被放进一个整块大小的全零张量（`slice_backward`），再和前面各块累加（`add`）。也就是说，**只把损失分块、输入的 logits 仍然整块物化，省不了太多**。
#
# ### 4.2 在整个蒸馏步里分块
#
# 上面的分块有一个漏洞：输入的两份 $[N, V]$ logits 还是整块物化了。真正省显存的做法是连 logits 也分块算：两个模型都只跑到最后的隐藏状态（学生 $[N, d_s]$，教师 $[N, d_t]$，比 $[N, V]$ 小两个数量级），然后每次取一块 token，乘输出层得到这一块的 logits，算 KL；学生那一侧用 `checkpoint` 包起来，反向时重算这一块。这和第 15 章的分块交叉熵是同一个思路。

# %%
def kd_loss_chunked(student, teacher, batch, T=TEMP, chunk=256):
    h_s = student.transformer(input_ids=batch).last_hidden_state.flatten(0, 1)      # [N, d_s]
    with torch.no_grad():
        h_t = teacher.transformer(input_ids=batch).last_hidden_state.flatten(0, 1)  # [N, d_t]
    w_s, w_t = student.lm_head.weight, teacher.lm_head.weight

    def part(hs, ht):
        s_logp = F.log_softmax((hs @ w_s.t()).float() / T, -1)
        with torch.no_grad():
            t_logp = F.log_softmax((ht @ w_t.t()).float() / T, -1)
        return F.kl_div(s_logp, t_logp, reduction="sum", log_target=True)

    total = 0
    for i in range(0, h_s.shape[0], chunk):
        total = total + checkpoint(part, h_s[i:i + chunk], h_t[i:i + chunk], use_reentrant=False)
    return total / h_s.shape[0] * T * T


def distill_step_chunked(student, teacher, optimizer, batch, device):
    teacher.eval()
    return _finish(kd_loss_chunked(student, teacher, batch), optimizer)


# 先用真实张量确认分块的损失和更新与整块相同
r_full, r_chunk = small["C no_grad + eval"], run_small(distill_step_chunked)
diff = max((a - b).abs().max().item() for a, b in zip(r_full["student"], r_chunk["student"]))
publish("chunk_student_maxdiff", f"{diff:.1e}")
publish("chunk_same_losses", "相同" if r_full["losses"] == r_chunk["losses"] else "不完全相同")
print(f"真实张量（小模型对）：整块 KL 各步损失 {[round(x, 5) for x in r_full['losses']]}，"
      f"分块 {[round(x, 5) for x in r_chunk['losses']]}；学生参数最大差 {diff:.1e}\n")

print("教师 gpt2-small，学生 gpt2-mini，教师在 no_grad 下（MiB）")
print(pad("配置", 12), pad("整块 KL 峰值", 14), pad("分块 KL 峰值", 14), pad("分块/整块", 10), "一份 FP32 logits")
chunk_rows = {}
for b, s in ((4, 256), (4, 1024)):
    full = main["C no_grad + eval"] if (b, s) == (4, 256) else run(distill_step_nograd, b=b, s=s)
    ch = run(distill_step_chunked, b=b, s=s)
    chunk_rows[b, s] = (full, ch)
    print(pad(f"b={b} s={s}", 12), pad(f"{mib(full['peak']):.1f}", 14), pad(f"{mib(ch['peak']):.1f}", 14),
          pad(f"{ch['peak'] / full['peak']:.2f}", 10), f"{mib(b * s * V * 4):.1f}")
    publish(f"chunk_s{s}_logits_mib", mib(b * s * V * 4), fmt="{:.1f}")
    publish(f"chunk_s{s}_full_mib", mib(full["peak"]), fmt="{:.1f}")
    publish(f"chunk_s{s}_chunked_mib", mib(ch["peak"]), fmt="{:.1f}")
    publish(f"chunk_s{s}_ratio", ch["peak"] / full["peak"], fmt="{:.2f}")

# %% [markdown]
# 序列越长，logits 在峰值里占的比重越大，分块省得越多。代价是学生的输出层矩阵乘在反向时要重算一遍（每块一次），以及一个 Python 循环。
#
# ### 4.3 离线蒸馏：只缓存教师的 top-k
#
# 如果教师的输出可以提前算好存到磁盘上，训练学生时卡上就根本不需要教师（离线蒸馏，offline distillation）。但完整的 logits 太大：每个 token $V$ 个数。常见的折中是每个 token 只存教师概率最大的 $k$ 个词的编号和对数概率。下面先算存储量，再在设备上比较：在线蒸馏（教师 FP32 常驻、`no_grad`）与离线蒸馏（只有学生和一批 top-k 缓存在卡上）的峰值。

# %%
K = 32
print(pad("每个 token 存什么", 34), pad("字节/token", 12), "10 亿个 token 共计")
for label, per, key in ((f"完整 logits，FP32（V={V}）", V * 4, "fp32"), ("完整 logits，BF16", V * 2, "bf16"),
                        (f"top-{K}：FP16 对数概率 + int32 编号", K * (2 + 4), f"top{K}"), ("top-8：同上", 8 * (2 + 4), "top8")):
    total = per * 1e9
    print(pad(label, 34), pad(f"{per:,}", 12), f"{total / 1e12:,.3f} TB" if total >= 1e12 else f"{total / 1e9:,.1f} GB")
    publish(f"store_{key}_bytes", f"{per:,}")
    publish(f"store_{key}_total", f"{total / 1e12:,.1f} TB" if total >= 1e12 else f"{total / 1e9:,.1f} GB")


def topk_kd_loss(s_logits, t_vals, t_idx, T=TEMP):
    """只在教师的 top-k 词上算 Σ p·(log p − log q)；t_vals 是教师在温度 T 下的 log-softmax 取 top-k。"""
    s_logp = F.log_softmax(s_logits.flatten(0, 1).float() / T, -1)
    q = s_logp.gather(-1, t_idx.flatten(0, 1).long())
    p_log = t_vals.flatten(0, 1).float()
    return (p_log.exp() * (p_log - q)).sum(-1).mean() * T * T


def run_offline(b=4, s=256, k=K, steps=2, fake=FAKE):
    with vramlab.open_device("auto", fake=fake) as dev:
        student = build_model("gpt2-mini", device=dev.torch_device, seed=0)
        student.train()
        opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
        for i in range(steps):
            batch = torch.randint(0, V, (b, s), device=dev.torch_device)
            with dev.host():   # 缓存在主存（真实场景：磁盘上的预计算文件，由 DataLoader 读入）
                cache_vals = torch.randn(b, s, k).half()
                cache_idx = torch.randint(0, V, (b, s, k), dtype=torch.int32)
            t_vals, t_idx = dev.to_device(cache_vals), dev.to_device(cache_idx)   # 每批 b·s·k·6 字节上卡
            if i == 1:
                dev.reset_peak()
            s_logits = student(input_ids=batch).logits
            _finish(topk_kd_loss(s_logits, t_vals, t_idx), opt)
        return dict(peak=dev.max_allocated(), bd=dev.breakdown())


off = run_offline()
on = main["C no_grad + eval"]
print(f"\nb=4, s=256：在线（教师 FP32 常驻，no_grad）峰值 {mib(on['peak']):.1f} MiB，其中参数 {mib(on['bd']['parameters']):.1f} MiB；")
print(f"            离线 top-{K}（卡上只有学生）峰值 {mib(off['peak']):.1f} MiB，其中参数 {mib(off['bd']['parameters']):.1f} MiB；"
      f"之比 {off['peak'] / on['peak']:.2f}")
publish("off_peak_mib", mib(off["peak"]), fmt="{:.1f}")
publish("off_ratio", off["peak"] / on["peak"], fmt="{:.2f}")

# %% [markdown]
# 离线蒸馏省掉的是教师的参数和教师的那一份 logits；学生自己的 logits 和 log-softmax 还在（要省它们，同样可以分块）。top-$k$ 缓存把每个 token 从 196 KiB 压到 192 字节，但它丢掉了 top-$k$ 以外的概率质量，是对教师分布的**有偏**近似（正文有讨论）。下面用真实的小模型对看一眼截断后还剩多少概率质量。注意这里的教师是随机初始化的，它的分布几乎是均匀的，所以 top-$k$ 覆盖的质量很小；训练好的语言模型的分布要尖锐得多，同样的 $k$ 覆盖的质量也大得多。这个数字只说明“怎么量”，不代表真实教师。

# %%
teacher = TEACHER_SMALL.to("cpu").eval()         # 只比较数值，在 CPU 上算
ids = torch.randint(0, V, (2, 32), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    t_logp = F.log_softmax(teacher(input_ids=ids).logits.float() / TEMP, -1)
for k in (8, 32, 1024):
    mass = t_logp.topk(k, dim=-1).values.exp().sum(-1).mean().item()
    print(f"随机初始化的 gpt2-mini 教师，T={TEMP}：top-{k} 平均覆盖概率质量 {mass:.4f}（均匀分布时为 {k / V:.4f}）")
    publish(f"topk_mass_{k}", mass, fmt="{:.4f}")

# %% [markdown]
# ## 5. 特征蒸馏 vs logit 蒸馏
#
# FitNets（Romero 等人，2015）让学生的某个中间层（被引导层，guided layer）去拟合教师某个中间层（提示层，hint layer）的输出。两者宽度不同，所以中间加一个可训练的回归器（regressor）把学生的特征映射到教师的宽度，损失是两者的均方误差。这里取学生 `gpt2-mini` 第 2 个 block（共 4 个）的输出（512 维），经 `nn.Linear(512, 768)` 去拟合教师 GPT-2 small 第 6 个 block（共 12 个）的输出（768 维）。用前向钩子取中间层的输出。比较四种做法（FakeTensorMode，b=4，s=256，教师都在 `no_grad` 下）：
#
# - **logit**：第 2 节的 C；
# - **特征（完整教师）**：教师跑完全部 12 层（只到最后的隐藏状态，不乘输出层），学生也不乘输出层，只有提示损失；
# - **特征（截断教师）**：提示层在第 6 层，那第 7–12 层根本不必放上卡：教师只建前 6 层；
# - **logit + 特征**：两种损失相加（TinyBERT、DistilBERT 都是多种损失的组合）。

# %%
HINT_T, GUIDED_S = 5, 1        # 教师第 6 个 block、学生第 2 个 block（从 0 数）


def capture(block, store, key):
    return block.register_forward_hook(lambda mod, args, out: store.__setitem__(key, out))


def run_feature(mode, b=4, s=256, steps=2, fake=FAKE):
    with vramlab.open_device("auto", fake=fake) as dev:
        if mode == "feature-trunc":                       # 只建教师的前 6 层（真实场景：只加载这些层的权重）
            cfg = make_config("gpt2-small")
            cfg.n_layer = HINT_T + 1
            torch.manual_seed(1)
            with torch.device(dev.torch_device):
                teacher = transformers.GPT2LMHeadModel(cfg)
        else:
            teacher = build_model("gpt2-small", device=dev.torch_device, seed=1)
        student = build_model("gpt2-mini", device=dev.torch_device, seed=0)
        teacher.eval()
        student.train()
        with torch.device(dev.torch_device):
            regressor = torch.nn.Linear(512, 768)          # FitNets 的回归器，和学生一起训练
        opt = torch.optim.AdamW(list(student.parameters()) + list(regressor.parameters()), lr=1e-4)
        feats = {}
        hooks = [] if mode == "logit" else [capture(teacher.transformer.h[HINT_T], feats, "t"),
                                            capture(student.transformer.h[GUIDED_S], feats, "s")]
        for i in range(steps):
            batch = torch.randint(0, V, (b, s), device=dev.torch_device)
            if i == 1:
                dev.reset_peak()
            with torch.no_grad():
                t_out = teacher(input_ids=batch) if mode in ("logit", "both") else teacher.transformer(input_ids=batch)
            if mode in ("logit", "both"):
                s_logits = student(input_ids=batch).logits
                loss = kd_loss(s_logits, t_out.logits)
            else:
                student.transformer(input_ids=batch)       # 只为了经过被引导层；上面几层的输出没人用，随即释放
                loss = 0
            if mode != "logit":
                loss = loss + F.mse_loss(regressor(feats["s"]), feats["t"])
            del t_out
            feats.clear()
            _finish(loss, opt)
        for h in hooks:
            h.remove()
        n_t = sum(p.numel() for p in teacher.parameters())
        return dict(peak=dev.max_allocated(), bd=dev.breakdown(), n_t=n_t, where=dev.snapshot()["peak_where"])


feat = {label: run_feature(mode) for label, mode in (("logit", "logit"), ("特征（完整教师）", "feature"),
                                                       ("特征（截断教师，前 6 层）", "feature-trunc"), ("logit + 特征", "both"))}
print("教师 gpt2-small，学生 gpt2-mini + 回归器 512→768，b=4，s=256（MiB）\n")
print(pad("做法", 28), pad("教师参数量", 14), pad("峰值", 9), *[pad(zh, 11) for _, zh in CATS[:5]])
for label, r in feat.items():
    print(pad(label, 28), pad(f"{r['n_t']:,}", 14), pad(f"{mib(r['peak']):.1f}", 9),
          *[pad(f"{mib(r['bd'].get(k, 0)):.1f}", 11) for k, _ in CATS[:5]])
print()
for label, r in feat.items():
    print(pad(label, 28), "峰值位置：", r["where"])
print(f"\n回归器 nn.Linear(512, 768)：{512 * 768 + 768:,} 个参数，连同梯度和 AdamW 状态共 {mib(16 * (512 * 768 + 768)):.1f} MiB")
for label, r in feat.items():
    key = {"logit": "logit", "特征（完整教师）": "full", "特征（截断教师，前 6 层）": "trunc", "logit + 特征": "both"}[label]
    publish(f"feat_{key}_n_t", f"{r['n_t']:,}")
    publish(f"feat_{key}_peak_mib", mib(r["peak"]), fmt="{:.1f}")
publish("feat_full_n_t_yi", feat["特征（完整教师）"]["n_t"] / 1e8, fmt="{:.2f}")
publish("feat_trunc_n_t_wan", feat["特征（截断教师，前 6 层）"]["n_t"] / 1e4, fmt="{:.0f}")
publish("regressor_params", f"{512 * 768 + 768:,}")
publish("regressor_state_mib", mib(16 * (512 * 768 + 768)), fmt="{:.1f}")
print(f"一份教师提示特征 [4, 256, 768] FP32：{mib(4 * 256 * 768 * 4):.1f} MiB；一份 logits [4, 256, {V}]：{mib(4 * 256 * V * 4):.1f} MiB")

# %% [markdown]
# 特征蒸馏要存的东西和 logit 蒸馏完全不同：
#
# - **logit 蒸馏**要两份 $[b, s, V]$ logits 和 KL 的临时张量，$V$ 越大越贵；教师必须整个放上卡（输出层在最后）。
# - **特征蒸馏**只要一份 $[b, s, d_t]$ 的教师特征（$d_t = 768$，比 $V$ 小 65 倍），外加一个很小的回归器。没有了 logits，峰值移到了 `optimizer.step()`（“临时张量”一列是 AdamW `foreach` 实现的临时张量，第 19 章）。只有被引导层及以下的学生参数得到梯度和优化器状态，这正是 FitNets 第一阶段的做法：先只训练到被引导层。
# - 提示层以上的教师层根本不必加载：截断教师那一行，教师参数从 1.24 亿降到 8191 万（前 6 层加上嵌入层，GPT-2 small 的词嵌入就有 3860 万个参数）。
# - 两者相加时，峰值和纯 logit 蒸馏几乎一样：峰值仍在算 KL 的那一刻，特征那一部分（一份教师特征、回归器、学生被引导层的梯度路径）只多几 MiB。
#
# 需要提醒的是，特征蒸馏的提示特征如果来自 `torch.inference_mode()`，不能直接送进 `F.mse_loss`：均方误差要为反向保存目标张量，而推理张量（inference tensor）不能被保存，会报 `RuntimeError: Inference tensors cannot be saved for backward`。用 `torch.no_grad()`，或者先 `.clone()` 一份（多占一份特征的显存）。

# %%
with torch.inference_mode():
    target = torch.randn(2, 4)
pred = torch.randn(2, 4, requires_grad=True)
try:
    F.mse_loss(pred, target).backward()
except RuntimeError as e:
    print("RuntimeError:", str(e).split(".")[0])
F.mse_loss(pred, target.clone()).backward()
print("clone() 之后可以反向；或者一开始就用 torch.no_grad()")

# %% [markdown]
# ## 小结
#
# 把本教程的主要数字放在一起（模拟设备，b=4，s=256，教师 GPT-2 small，学生 `gpt2-mini`；稳态已分配峰值，MiB）：

# %%
rows = [("A 教师在 autograd 下（起始代码）", main["A autograd（起始代码）"]["peak"]),
        ("C 教师 no_grad + eval", main["C no_grad + eval"]["peak"]),
        ("E 同 C，教师 BF16", main["E 同 C，教师 BF16"]["peak"]),
        ("C + 分块 KL", chunk_rows[4, 256][1]["peak"]),
        (f"离线 top-{K}（卡上无教师）", off["peak"]),
        ("特征蒸馏（截断教师）", feat["特征（截断教师，前 6 层）"]["peak"])]
for label, p in rows:
    print(pad(label, 34), pad(f"{mib(p):.1f}", 10), f"{p / base:.2f}")
print(f"\n本教程 CPU 时间约 {time.process_time() - T0:.0f} 秒（只作参考，取决于机器）")
