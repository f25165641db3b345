# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 第 29 章 动手教程：显存调优工具链
#
# 这份教程配合[第 29 章 显存调优工具链](ch29.md)，分四部分：
#
# 1. **ZeRO 的账**：按 ZeRO 论文的公式，和 DeepSpeed 源码里自带的估算函数，给 Llama-7B 形状的模型在 8 张卡上算每卡模型状态（纯算术，与机器无关），再用 `vramlab.estimate` 加上激活值看完整峰值。
# 2. **Hugging Face Accelerate 在 CPU 上真跑**：`Accelerator(mixed_precision=..., gradient_accumulation_steps=...)` 训练一个小 GPT-2，在模拟设备上量四种组合的峰值和分类；再调用 `accelerate estimate-memory` 背后的两个函数，看它的 “Training using Adam” 一列是怎么算的。
# 3. **ZeRO-1 与 ZeRO-2，两个 gloo 进程**：用 PyTorch 的 `ZeroRedundancyOptimizer`（ZeRO-1）和手写的 ZeRO-2（梯度一算好就规约给它的“所有者”，其余 rank 立刻释放）训练同一个模型，逐 rank 量峰值，确认更新完全相同。这就是评分练习 `ch29-zero2` 的思路。
# 4. **对照表**：各工具的选项分别省的是哪一类显存、省多少（按公式算到 Llama-7B、8 卡上）。
#
# DeepSpeed、Megatron-LM、ColossalAI 没有装在这个环境里（它们的训练路径面向 NVIDIA GPU），本教程不运行它们；它们的真实配置文件放在 `docs/assets/configs/ch29/`，正文逐项讲解。

# %%
import datetime
import gc
import os
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

import accelerate
import vramlab
from vramlab.display import banner, pad, mib, free_port
from vramlab.estimate import estimate, param_count, zero_model_state_bytes
from vramlab.models import build_model, count_params
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.workload import Workload

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
ON_GPU = banner(f"accelerate {accelerate.__version__}")
T_START = time.perf_counter()
GiB = 1024**3
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
publish("accelerate", accelerate.__version__)

# %% [markdown]
# ## 1. ZeRO 的账：论文公式与 DeepSpeed 自带的估算函数
#
# 设参数量为 $\Psi$、数据并行的卡数为 $N$。混合精度 + Adam 时，每个参数有 16 位权重 2 字节、16 位梯度 2 字节和 $K = 12$ 字节的优化器状态（FP32 主权重、$m$、$v$）。ZeRO 论文给出的每卡模型状态（见第 10 章）：
#
# $$M_0 = (2+2+K)\Psi,\quad M_1 = 4\Psi + \frac{K\Psi}{N},\quad M_2 = 2\Psi + \frac{(2+K)\Psi}{N},\quad M_3 = \frac{(2+2+K)\Psi}{N}.$$
#
# DeepSpeed 自己也带了估算函数：`deepspeed/runtime/zero/stage_1_and_2.py` 里的 `estimate_zero2_model_states_mem_needs` 和 `stage3.py` 里的 `estimate_zero3_model_states_mem_needs`。DeepSpeed 没装在这里，下面把这两个函数的 GPU 一侧按源码原样抄成三行（CPU 一侧带一个 1.5 的“额外缓冲系数”，这里不列）。注意它们的系数是 18 而不是 16：源码注释写明多算了一份 4 字节的 FP32 梯度分片（2 字节 16 位梯度 + 4 字节 FP32 梯度 + 4 字节 FP32 主权重 + 8 字节 $m$、$v$）；ZeRO-3 还要加上“最大一层”的 4 倍参数量，留给全收集出来的完整参数。

# %%
def ds_zero2_gpu_bytes(psi, n, offload_optimizer):
    """DeepSpeed estimate_zero2_model_states_mem_needs 的 gpu_mem（源码原式）。"""
    return 2 * psi if offload_optimizer else 2 * psi + int(18 * psi / n)


def ds_zero3_gpu_bytes(psi, largest, n, offload_optimizer, offload_param):
    """DeepSpeed estimate_zero3_model_states_mem_needs 的 gpu_mem（源码原式）。"""
    if offload_optimizer and offload_param:
        return 4 * largest
    if offload_optimizer:
        return 4 * largest + int(2 * psi / n)
    return 4 * largest + int(18 * psi / n)


def largest_layer_params(model_name):
    """与 DeepSpeed 的 model_to_params 相同：单个模块自己的参数（不含子模块）最多的那个。"""
    m = build_model(model_name, device="meta")
    return max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in m.modules())


MODEL_BIG, N = "llama-7b", 8
PSI = param_count(MODEL_BIG)
LARGEST = largest_layer_params(MODEL_BIG)
print(f"{MODEL_BIG}：Ψ = {PSI:,} 个参数，最大一层 {LARGEST:,} 个参数（词嵌入），N = {N} 张卡\n")
rows = [
    ("ZeRO-0（普通数据并行）", zero_model_state_bytes(PSI, 0, N), None),
    ("ZeRO-1", zero_model_state_bytes(PSI, 1, N), None),
    ("ZeRO-2", zero_model_state_bytes(PSI, 2, N), ds_zero2_gpu_bytes(PSI, N, False)),
    ("ZeRO-2 + offload_optimizer", None, ds_zero2_gpu_bytes(PSI, N, True)),
    ("ZeRO-3", zero_model_state_bytes(PSI, 3, N), ds_zero3_gpu_bytes(PSI, LARGEST, N, False, False)),
    ("ZeRO-3 + offload_optimizer", None, ds_zero3_gpu_bytes(PSI, LARGEST, N, True, False)),
    ("ZeRO-3 + 两者都卸载", None, ds_zero3_gpu_bytes(PSI, LARGEST, N, True, True)),
]
print(pad("配置", 30), pad("论文公式 GiB", 14), "DeepSpeed 估算函数 GiB")
for name, paper, ds in rows:
    print(pad(name, 30), pad("-" if paper is None else f"{paper / GiB:.2f}", 14),
          "-" if ds is None else f"{ds / GiB:.2f}")
DSKEY = dict(zip((r[0] for r in rows), ("z0", "z1", "z2", "z2off", "z3", "z3off", "z3both")))
for name, paper, ds in rows:
    publish(f"ds_{DSKEY[name]}_paper", "—" if paper is None else f"{paper / GiB:.2f}")
    publish(f"ds_{DSKEY[name]}_ds", "—" if ds is None else f"{ds / GiB:.2f}")
publish("psi_7b", f"{PSI:,}")
publish("largest_7b", f"{LARGEST:,}")

# %% [markdown]
# 两套数字的差别有来处：DeepSpeed 的估算多算了一份 FP32 梯度分片（$2\Psi/N$ 的差），ZeRO-3 还多了最大一层的完整参数。它们都只算**模型状态**，不含激活值。注意 DeepSpeed 打印这些数时用的单位写作“GB”，实际除的是 $2^{30}$，也就是 GiB。
#
# 把激活值也算上，用 `vramlab.estimate`（BF16 混合精度 + AdamW，批大小 1、序列长度 2048；ZeRO 1–3 按 DeepSpeed 的做法建模），再比较“不做激活检查点”和“完整检查点”（相当于 Megatron 的 `--recompute-granularity full`）：

# %%
from vramlab.estimate import PHASE_ZH      # 估算器给出的峰值时刻，中文名
print(pad("ZeRO", 6), pad("检查点", 10), pad("模型状态 GiB", 14), pad("估算峰值 GiB", 14), "峰值时刻")
for z in (0, 1, 2, 3):
    for ck in ("none", "full"):
        w = Workload(model=MODEL_BIG, batch=1, seq=2048, precision="bf16-mixed", zero=z, gpus=N if z else 1,
                     checkpointing=ck)
        e = estimate(w)
        print(pad(str(z), 6), pad(ck, 10), pad(f"{zero_model_state_bytes(PSI, z, N) / GiB:.2f}", 14),
              pad(f"{e.total_bytes / GiB:.2f}", 14), PHASE_ZH.get(e.peak_phase, e.peak_phase))
        publish(f"est_z{z}_{ck}_state_gib", zero_model_state_bytes(PSI, z, N) / GiB, fmt="{:.2f}")
        publish(f"est_z{z}_{ck}_peak_gib", e.total_bytes / GiB, fmt="{:.2f}")
        publish(f"est_z{z}_{ck}_phase", PHASE_ZH.get(e.peak_phase, e.peak_phase))

# %% [markdown]
# ZeRO 只切模型状态；序列一长，激活值就成了 ZeRO-3 下的大头，这时要靠检查点（或 Megatron 的序列并行、张量并行）去切激活值。工具链里的各个选项，本质上就是在这两类显存上各自下刀。
#
# ## 2. Hugging Face Accelerate：混合精度与梯度累积，真跑
#
# Accelerate 在 CPU 上也能运行（`Accelerator(cpu=True)`），所以这里直接用它训练 `tiny`（2 层 GPT-2），全局批次 8 条、序列长度 64，这时激活值占峰值的大头。每个“全局批次”是 8 条序列；`gradient_accumulation_steps=4` 时分成 4 个微批次，每个 2 条。
#
# 写法就是 Accelerate 文档里的标准循环：`accelerator.prepare(model, optimizer)`，`with accelerator.accumulate(model):` 里前向、`accelerator.backward(loss)`、`optimizer.step()`、`optimizer.zero_grad()`。累积期间 `optimizer.step()` 是空操作（被包装过的优化器只在 `accelerator.sync_gradients` 为真时才真正更新），`accelerator.backward` 会把损失除以累积步数。
#
# 每种组合跑 3 个全局批次，第 1 个热身，峰值取后两个（模拟设备，关掉了固定 64 MiB 的 cuBLAS 工作区，以免它淹没这个小模型的差别；在 GPU 上运行时是真实的 `max_memory_allocated`）。

# %%
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

ACC_MODEL, GLOBAL_B, ACC_T, ACC_STEPS = "tiny", 8, 64, 3


def run_accelerate(mixed_precision, accum):
    AcceleratorState._reset_state(True)      # 同一进程里换配置，要先清掉 Accelerate 的全局状态
    GradientState._reset_state()
    dev = vramlab.open_device("auto") if ON_GPU else vramlab.SimDevice(cublas_workspace=False)
    with dev:
        acc = Accelerator(cpu=not ON_GPU, mixed_precision=mixed_precision, gradient_accumulation_steps=accum)
        torch.manual_seed(0)
        model = build_model(ACC_MODEL, device=dev.torch_device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt = acc.prepare(model, opt)
        gen = torch.Generator().manual_seed(0)
        batches = [torch.randint(0, 1000, (GLOBAL_B, ACC_T), generator=gen) for _ in range(ACC_STEPS)]
        losses = []
        for i, full in enumerate(batches):
            if i == 1:
                dev.reset_peak()
            step_loss = 0.0
            for mb in full.to(acc.device).chunk(accum):
                with acc.accumulate(model):
                    loss = model(input_ids=mb, labels=mb).loss
                    acc.backward(loss)
                    opt.step()
                    opt.zero_grad()
                step_loss += loss.item() / accum
            losses.append(round(step_loss, 4))
        out = dict(peak=dev.max_allocated(), breakdown=dev.breakdown(), losses=losses,
                   param_dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                   wsum=float(sum(p.detach().double().sum() for p in model.parameters())))
        del model, opt, acc
    gc.collect()
    return out


acc_res = {}
for mp_ in ("no", "bf16"):
    for accum in (1, 4):
        acc_res[(mp_, accum)] = run_accelerate(mp_, accum)

# %% tags=["acc"]
print(f"{ACC_MODEL}：Ψ = {count_params(ACC_MODEL):,}；全局批次 {GLOBAL_B} × 序列长度 {ACC_T}，AdamW\n")
print(pad("mixed_precision", 16), pad("累积", 5), pad("峰值 MiB", 10), pad("参数", 7), pad("梯度", 7),
      pad("优化器状态", 11), pad("激活值", 8), pad("临时", 7), pad("参数类型", 9), "三步的损失")
for (mp_, accum), r in acc_res.items():
    bd = r["breakdown"]
    print(pad(mp_, 16), pad(str(accum), 5), pad(f"{mib(r['peak']):.2f}", 10),
          *[pad(f"{mib(bd.get(k, 0)):.2f}", w) for k, w in
            (("parameters", 7), ("gradients", 7), ("optimizer_state", 11), ("activations", 8), ("temporaries", 7))],
          pad(r["param_dtype"], 9), r["losses"])
publish("acc_psi", f"{count_params(ACC_MODEL):,}")
for (mp_, accum), r in acc_res.items():
    bd = r["breakdown"]
    publish(f"acc_{mp_}_{accum}_peak_mib", mib(r["peak"]), fmt="{:.2f}")
    publish(f"acc_{mp_}_{accum}_act_mib", mib(bd.get("activations", 0)), fmt="{:.2f}")
    publish(f"acc_{mp_}_{accum}_grad_mib", mib(bd.get("gradients", 0)), fmt="{:.2f}")
publish("acc_bf16_minus_no_4_mib", round(mib(acc_res[("bf16", 4)]["peak"]), 2) - round(mib(acc_res[("no", 4)]["peak"]), 2), fmt="{:.2f}")
publish("acc_same_losses_no", "相同" if acc_res[("no", 1)]["losses"] == acc_res[("no", 4)]["losses"] else "只差舍入")

# %% [markdown]
# 读这张表（各列是峰值时刻的分类，单位 MiB）：
#
# - **梯度累积**把一个全局批次切成 4 个微批次，激活值按微批次大小下降，峰值跟着降；代价是峰值时刻多了一份常驻的梯度（累积期间梯度一直活着）。4 个微批次的损失平均值与不累积时只差浮点舍入（BF16 下矩阵乘按微批次分块，舍入不同，差得稍多一点）。
# - **`mixed_precision="bf16"`** 只是在前向外面套了 autocast：参数类型仍是 `float32`，参数、梯度、优化器状态一分没少，省的只是激活值（矩阵乘的输入输出变成 16 位）。想让模型状态也变小，要靠 DeepSpeed / FSDP 的分片或 16 位参数，这正是本章对照表要说的。
#
# 确认累积不改变训练：两种累积设置在同一精度下，三步之后的参数之和只差浮点舍入。

# %%
for mp_ in ("no", "bf16"):
    a, b = acc_res[(mp_, 1)]["wsum"], acc_res[(mp_, 4)]["wsum"]
    print(f"mixed_precision={mp_!r}：参数之和 累积 1 = {a:.6f}，累积 4 = {b:.6f}，相对差 {abs(a - b) / abs(a):.1e}")
    publish(f"acc_wsum_reldiff_{mp_}", f"{abs(a - b) / abs(a):.1e}")

# %% [markdown]
# ### `accelerate estimate-memory` 是怎么算的
#
# 命令行工具 `accelerate estimate-memory <模型名>` 要从 Hugging Face Hub 下载模型配置（这里离线，不能运行），然后在 meta 设备上建一个空模型，数出“最大一层”和“总大小”。它背后就是下面两个函数，都能在离线环境里直接调用：`accelerate.utils.calculate_maximum_sizes(model)` 和 `accelerate.commands.estimate.estimate_training_usage(bytes, mixed_precision)`。我们用 meta 设备上的 GPT-2 small 喂给它们：

# %% tags=["estmem"]
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes

meta_small = build_model("gpt2-small", device="meta")
total, (largest, largest_names) = calculate_maximum_sizes(meta_small)
psi_small = count_params("gpt2-small")
print(f"gpt2-small：Ψ = {psi_small:,}；calculate_maximum_sizes 给出总大小 {total:,} 字节（FP32），"
      f"最大一层 {largest:,} 字节 {largest_names}")
print(f"总大小 / Ψ = {total / psi_small:.3f} 字节/参数\n")
for dtype in ("float32", "float16"):
    usage = estimate_training_usage(total, dtype)
    print(f"dtype={dtype}: " + "，".join(f"{k} {v / 2**20:.0f} MiB" for k, v in usage.items())
          + f" → “Training using Adam”一列取 max = {max(usage.values()) / 2**20:.0f} MiB"
          + f"（{max(usage.values()) / psi_small:.1f} 字节/参数）")

# %% [markdown]
# 这个工具的“Training using Adam”是各项里的**最大值**，不是总和：FP32 时 `step` 一项恰好是 $4 \times$ 模型大小（16 字节/参数，与 $4+4+8$ 的总和一致）；`float16` 一行却只给出优化器状态那一项（8 字节/参数），比混合精度 + Adam 实际需要的 16 字节/参数少一半。而且它不含激活值。它的文档也说明这只是加载和训练的下限估计：拿来判断“放不放得下模型”可以，拿来做训练预算不够。`total` 正好是 $4\Psi$ 字节：它按 FP32 数参数（加上缓冲区，这个模型没有），与输出层共享的词嵌入只算一次。
#
# ## 3. ZeRO-1 与 ZeRO-2：两个 gloo 进程
#
# 这一部分照搬第 10、20 章教程的做法：用 `torch.multiprocessing` 以 `fork` 启动 2 个进程，连上 `127.0.0.1` 的空闲端口，`init_process_group("gloo")`，每个 rank 里套一个模拟设备（关掉 cuBLAS 工作区）计量。模型是 `tiny`（FP32 + AdamW），每个 rank 批大小 1、序列长度 32（让模型状态而不是激活值决定峰值，ZeRO 切的正是模型状态），训练 3 步，取第 3 步的峰值。三种写法：
#
# | 名称 | 做法 |
# |---|---|
# | `dp` | 普通数据并行：反向结束后逐参数 `all_reduce` 梯度、除以 rank 数，每个 rank 用完整的 AdamW 更新全部参数 |
# | `zero1` | 梯度同上；优化器换成 `ZeroRedundancyOptimizer(..., optimizer_class=torch.optim.AdamW)`：每个 rank 只为分给自己的参数存 AdamW 状态、只更新它们，再广播。评分练习的起始代码就是这样 |
# | `zero2` | 手写 ZeRO-2：每个参数挂 `register_post_accumulate_grad_hook`，梯度一算好就 `dist.reduce` 给拥有它的 rank；拥有者除以 rank 数留下，其他 rank 立刻释放；反向结束后拥有者用只含自己参数的 AdamW 更新，再 `dist.broadcast` 给对方 |
#
# 参数的“所有者”用和 `ZeroRedundancyOptimizer` 相同的贪心规则分配：按元素个数从大到小，依次交给当前总量最小的 rank。和第 20 章一样，释放梯度时先 `untyped_storage().resize_(0)`，不等 gloo 后台线程放开引用，让读数可重复。

# %%
MODEL, B, T, STEPS = "tiny", 1, 32, 3
KINDS = ["dp", "zero1", "zero2"]


def owners_of(params, world):
    """与 ZeroRedundancyOptimizer._partition_parameters 相同的贪心分配：参数 -> rank。"""
    load, owner = [0] * world, {}
    for p in sorted(params, key=lambda t: t.numel(), reverse=True):
        r = load.index(min(load))
        owner[p] = r
        load[r] += p.numel()
    return owner


def free_now(t):
    t.untyped_storage().resize_(0)


def hyper(opt):
    return {k: opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}


def train(kind, rank, world):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        model = build_model(MODEL)                      # 同一个种子：每个 rank 初始权重相同
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=1e-3)
        owner = owners_of(params, world)
        if kind == "zero1":
            zopt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **hyper(opt))
        if kind == "zero2":
            mine = [p for p in params if owner[p] == rank]
            local = torch.optim.AdamW(mine, **hyper(opt))          # 只管自己那一份

            def reduce_to_owner(p):                                # 这个参数的梯度刚累加完毕
                dist.reduce(p.grad, dst=owner[p])
                if owner[p] == rank:
                    p.grad.div_(world)
                else:
                    free_now(p.grad)
                    p.grad = None                                  # 不是我的：立刻释放
            for p in params:
                p.register_post_accumulate_grad_hook(reduce_to_owner)
        gen = torch.Generator().manual_seed(100 + rank)            # 每个 rank 不同的数据
        losses = []
        for step in range(STEPS):
            ids = torch.randint(0, 1000, (B, T), generator=gen)
            gc.collect()
            if step == STEPS - 1:
                dev.reset_peak()
                t0 = len(dev.tracker.timeline)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            grads_alive = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
            if kind in ("dp", "zero1"):
                for p in params:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            if kind == "dp":
                opt.step()
                opt.zero_grad(set_to_none=True)
            elif kind == "zero1":
                zopt.step()                                        # 更新自己那份，再广播
                zopt.zero_grad(set_to_none=True)
            else:
                local.step()
                local.zero_grad(set_to_none=True)
                for p in params:
                    dist.broadcast(p.data, src=owner[p])
            losses.append(round(loss.item(), 5))
        state_opt = {"dp": opt, "zero1": zopt.optim if kind == "zero1" else None,
                     "zero2": local if kind == "zero2" else None}[kind]
        state_bytes = sum(v.numel() * v.element_size() for st in state_opt.state.values()
                          for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        with torch.no_grad():
            wsum = float(sum(p.double().sum() for p in params))
        out = dict(peak=dev.max_allocated(), breakdown=dev.breakdown(), grads_alive=grads_alive,
                   state=state_bytes, losses=losses, wsum=wsum,
                   timeline=[a for a, _, _ in dev.tracker.timeline[t0:]])
        del model, opt, params
    return out


def worker(rank, world, port, kinds, queue):
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        queue.put((rank, {k: train(k, rank, world) for k in kinds}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(kinds, world=2):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    pc = mp.start_processes(worker, args=(world, free_port(), kinds, queue),
                            nprocs=world, start_method="fork", join=False)
    results = dict(queue.get(timeout=600) for _ in range(world))
    pc.join()
    return results


res = launch(KINDS)
print("2 个 rank 都已返回。")

# %% [markdown]
# 先确认三种写法训练的是同一件事：每个 rank 的损失相同，3 步之后的参数之和在 6 个（rank, 写法）组合里相同。

# %%
for rank in (0, 1):
    for kind in KINDS:
        r = res[rank][kind]
        print(f"rank {rank}  {pad(kind, 6)} 损失 {r['losses']}  参数之和 {r['wsum']:.6f}")
print("参数完全一致：", len({round(res[r][k]["wsum"], 6) for r in (0, 1) for k in KINDS}) == 1)
same_losses = all(res[r][k]["losses"] == res[r]["dp"]["losses"] for r in (0, 1) for k in KINDS)
same_wsum = len({round(res[r][k]["wsum"], 6) for r in (0, 1) for k in KINDS}) == 1
publish("zero_same", "完全相同" if same_losses and same_wsum else "不完全相同")

# %% [markdown]
# 再看显存。“反向后梯度”是反向刚结束时本 rank 上还活着的梯度字节数；“AdamW 状态”是本 rank 的优化器状态；其余列是第 3 步峰值时刻的分类（MiB）：

# %% tags=["zero_table"]
psi = count_params(MODEL)
print(f"{MODEL}：Ψ = {psi:,}，FP32 梯度整份 4Ψ = {mib(4 * psi):.2f} MiB，AdamW 状态整份 8Ψ = {mib(8 * psi):.2f} MiB\n")
print(pad("写法", 7), pad("rank", 5), pad("峰值", 7), pad("反向后梯度", 11), pad("AdamW 状态", 11),
      pad("峰值时：参数", 13), pad("梯度", 7), pad("优化器状态", 11), pad("激活值", 8), "临时")
for kind in KINDS:
    for rank in (0, 1):
        r = res[rank][kind]
        bd = r["breakdown"]
        print(pad(kind, 7), pad(str(rank), 5), pad(f"{mib(r['peak']):.2f}", 7), pad(f"{mib(r['grads_alive']):.2f}", 11),
              pad(f"{mib(r['state']):.2f}", 11), pad(f"{mib(bd.get('parameters', 0)):.2f}", 13),
              pad(f"{mib(bd.get('gradients', 0)):.2f}", 7), pad(f"{mib(bd.get('optimizer_state', 0)):.2f}", 11),
              pad(f"{mib(bd.get('activations', 0)):.2f}", 8), f"{mib(bd.get('temporaries', 0)):.2f}")
for kind in ("zero1", "zero2"):
    worst = max(res[r][kind]["peak"] for r in (0, 1))
    base = max(res[r]["dp"]["peak"] for r in (0, 1))
    print(f"\n{kind}：两个 rank 中较大的峰值是 dp 的 {worst / base:.2f} 倍", end="")
    publish(f"{kind}_over_dp", worst / base, fmt="{:.2f}")
print()
for kind in KINDS:
    for rank in (0, 1):
        r = res[rank][kind]
        publish(f"{kind}_r{rank}_peak_mib", mib(r["peak"]), fmt="{:.2f}")
        publish(f"{kind}_r{rank}_grads_mib", mib(r["grads_alive"]), fmt="{:.2f}")
        publish(f"{kind}_r{rank}_state_mib", mib(r["state"]), fmt="{:.2f}")

# %% [markdown]
# - `zero1` 的 AdamW 状态按张量分给两个 rank，但两个 rank 反向结束时都握着整份梯度（$4\Psi$）。
# - `zero2` 反向结束时每个 rank 只剩自己那一份梯度，别人的梯度在钩子里规约完就释放了；AdamW 状态与 `zero1` 一样是一份。峰值因此再降一截。
# - 分配按整个张量进行（和 `ZeroRedundancyOptimizer` 一样），`tiny` 碰巧能均分，两个 rank 的数一样；模型里有一个特别大的张量（如 GPT-2 的词嵌入）时，拥有它的 rank 会更满（第 10 章教程算过）。DeepSpeed 把梯度和状态拼进扁平缓冲区、再按元素均分，没有这个问题。
#
# 把 rank 0 第 3 步的已分配显存画出来（横轴是分配事件的序号）：

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()
fig, ax = plt.subplots(figsize=(8.5, 3.6))
for kind, style in (("dp", ":"), ("zero1", "--"), ("zero2", "-")):
    tl = res[0][kind]["timeline"]
    ax.plot(range(len(tl)), [mib(a) for a in tl], style, label=kind)
ax.set_xlabel("分配事件序号（第 3 步）" if ZH else "allocation event (step 3)")
ax.set_ylabel("已分配 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("rank 0：ZeRO-1 与 ZeRO-2 的一步" if ZH else "rank 0: one step of ZeRO-1 vs ZeRO-2")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# `dp` 从第一个事件起就高出一截：整份 AdamW 状态（$8\Psi$）一直常驻，`zero1`、`zero2` 只有一半。`zero1` 和 `zero2` 在前向阶段重合；进入反向后 `zero1` 一路上涨（整份梯度越积越多），`zero2` 涨得慢，因为不属于本 rank 的梯度一规约完就释放了；更新阶段 `zero1` 冲到最高点（整份梯度加上 AdamW 的临时张量），`zero2` 的最高点低一截。
#
# ## 4. 对照表：每个选项省的是哪一类显存
#
# 最后把正文里讲的选项放在一张表里，按公式算到 Llama-7B 形状、8 张卡上（混合精度 + Adam，模型状态 $16\Psi$ 字节；只算模型状态，激活值另见“作用于”一列）。这些是算术，不是实测；Megatron 的分布式优化器一行用的是 Megatron Core 文档给出的字节数（BF16 参数、FP32 梯度时非分布式 18 字节/参数、分布式 $6 + 12/d$）。

# %%
def gib(x):
    return f"{x / GiB:.2f}"


t, d = 8, 1                                       # Megatron：8 路张量并行、数据并行 1 组
rows = [
    ("DeepSpeed", "stage 0（不分片）", "—", gib(16 * PSI)),
    ("DeepSpeed", "stage 1", "优化器状态", gib(zero_model_state_bytes(PSI, 1, N))),
    ("DeepSpeed", "stage 2", "+ 梯度", gib(zero_model_state_bytes(PSI, 2, N))),
    ("DeepSpeed", "stage 3", "+ 参数", gib(zero_model_state_bytes(PSI, 3, N))),
    ("DeepSpeed", "stage 2 + offload_optimizer cpu", "优化器状态与更新搬到主存", gib(2 * PSI)),
    ("DeepSpeed", "stage 3 + offload_param/optimizer cpu", "全部模型状态在主存", gib(4 * LARGEST)),
    ("Megatron", "--use-distributed-optimizer，d=8", "优化器状态（含主权重）", gib((6 + 12 / 8) * PSI)),
    ("Megatron", "--tensor-model-parallel-size 8（约）", "参数、梯度、优化器状态、部分激活值", gib(18 * PSI / t)),
    ("Megatron", "--recompute-granularity / --sequence-parallel", "激活值", "—"),
    ("ColossalAI", "GeminiPlugin(placement_policy='static')", "参数/梯度/状态分片+按比例卸载", "—"),
    ("Accelerate", "mixed_precision='bf16'", "激活值", "—"),
    ("Accelerate", "gradient_accumulation_steps", "激活值（微批次变小）", "—"),
    ("Accelerate", "FSDP / DeepSpeed 插件", "同 FSDP2 / ZeRO", "同上"),
]
print(pad("工具", 11), pad("选项", 46), pad("切掉或搬走的", 36), "每卡模型状态 GiB")
for r in rows:
    print(pad(r[0], 11), pad(r[1], 46), pad(r[2], 36), r[3])
print(f"\n（Ψ = {PSI:,}；“—”表示它省的主要不是模型状态，或取决于运行时设置，见正文）")
publish("tbl_megatron_distopt_gib", (6 + 12 / 8) * PSI / GiB, fmt="{:.2f}")
publish("tbl_z1_gib", zero_model_state_bytes(PSI, 1, N) / GiB, fmt="{:.2f}")
print(f"本教程总用时 {time.perf_counter() - T_START:.0f} 秒（只作参考，取决于机器负载）")

# %% [markdown]
# 一句话总结这张表：ZeRO / FSDP / 分布式优化器 / Gemini 切的是**模型状态**，检查点、序列并行、混合精度、梯度累积切的是**激活值**，卸载把状态**换个地方**放。先用第 1 部分的公式看清峰值里哪一类最大，再挑对应的开关。
