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
# # 第 10 章 动手教程：数据并行的显存账
#
# 这个教程做四件事：
#
# 1. 用 `vramlab.estimate.zero_model_state_bytes` 复现 ZeRO 论文里 75 亿参数、64 张卡的例子（120 / 31.4 / 16.6 / 1.9 GB）；
# 2. 用估算器 `vramlab.estimate.estimate` 给 GPT-2 small 和 Llama-7B 在 8 张卡上列出 ZeRO 0–3 的每卡显存，并把单卡的 H200 参考行在模拟设备上复现一遍；
# 3. 在本机 CPU 上用 `torch.multiprocessing` 启动 **2 个进程**，用 gloo 后端组成一个真正的进程组，分别跑 DDP、DDP + `gradient_as_bucket_view`、DDP + `ZeroRedundancyOptimizer`（ZeRO-1）、FSDP2 `fully_shard`，逐个 rank 数出参数、梯度和优化器状态各占多少字节，和公式对照；
# 4. 用 4 个进程搭一个 2×2 的 `DeviceMesh`，看混合分片（HSDP）下每个 rank 存了多少。
#
# CPU 上没有显存分配器，所以第 3、4 部分的“显存”是**数出来的**：把每个 rank 本地张量（DTensor 取 `.to_local()`）的存储字节数加起来，同一块存储只算一次。每个 rank 里还套了一个 `vramlab.SimDevice`，它能量出 DDP 的梯度桶，但对 FSDP2 会多算（原因见第 3 部分），所以 FSDP2 以“数本地分片”为准。

# %%
import datetime
import os
import platform
import subprocess
import sys
import time
import unicodedata

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

import vramlab
from vramlab.estimate import estimate, zero_model_state_bytes, param_count
from vramlab.models import build_model, count_params
from vramlab.runner import measure_workload
from vramlab.display import free_port
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB
from vramlab.workload import Workload, from_reference_name

transformers.logging.set_verbosity_error()
GiB = 1024**3


def cell(text, width, left=False):
    """按显示宽度补空格（一个汉字占两格），让中文表头和数字对齐。"""
    text = str(text)
    w = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    pad = " " * max(width - w, 0)
    return text + pad if left else pad + text


backend = "cuda" if torch.cuda.is_available() else "sim"
print(f"Python {platform.python_version()} | torch {torch.__version__} | transformers {transformers.__version__} | {platform.machine()}")
print(f"显存后端：{backend}（{'NVIDIA GPU：' + torch.cuda.get_device_name(0) if backend == 'cuda' else 'CPU 上的模拟设备'}）")
print(f"gloo 可用：{dist.is_gloo_available()}，CPU 核数：{os.cpu_count()}")
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. ZeRO 论文的例子：75 亿参数、64 张卡
#
# 混合精度 + Adam 时，每个参数的模型状态是 16 位权重 2 字节、16 位梯度 2 字节，加上 $K = 12$ 字节的优化器状态（FP32 主权重 4、一阶矩 4、二阶矩 4）。设参数量为 $\Psi$、数据并行的卡数为 $N_d$，ZeRO 的三个阶段依次把优化器状态、梯度、参数切成 $N_d$ 份：
#
# | 阶段 | 每卡模型状态 |
# |---|---|
# | 0（普通数据并行） | $(2 + 2 + K)\Psi$ |
# | 1（切优化器状态） | $2\Psi + 2\Psi + K\Psi / N_d$ |
# | 2（再切梯度） | $2\Psi + (2 + K)\Psi / N_d$ |
# | 3（再切参数） | $(2 + 2 + K)\Psi / N_d$ |
#
# `zero_model_state_bytes(params, stage, n_gpus)` 就是这张表。论文图 1 的例子是 $\Psi = 7.5 \times 10^9$、$N_d = 64$：

# %%
PSI, ND = 7_500_000_000, 64
paper = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
print(cell("ZeRO 阶段", 10, True), cell("每卡模型状态 GB", 16), cell("论文图 1 GB", 12))
for stage in range(4):
    b = zero_model_state_bytes(PSI, stage, ND)
    print(cell(stage, 10, True), cell(f"{b / 1e9:.3f}", 16), cell(paper[stage], 12))
    publish(f"paper_zero{stage}_gb", f"{b / 1e9:.3f}".rstrip("0").rstrip("."))

# %% [markdown]
# 算出来的 31.406、16.641、1.875 GB 四舍五入就是论文的 31.4、16.6、1.9 GB（这里用十进制 GB，和论文一致）。阶段 1 到阶段 2 只省了 $2\Psi(1 - 1/N_d)$，而阶段 3 一下子把剩下的 $4\Psi$ 也除以了 64：卡越多，阶段 3 的优势越大。
#
# ## 2. 估算器：GPT-2 small 与 Llama-7B，8 张卡，ZeRO 0–3
#
# `estimate()` 在模型状态之外还算激活值、logits 和临时张量。下面两个工作负载都用 BF16 混合精度 + AdamW、8 张卡（`--gpus 8`）。ZeRO 0 时估算器按 PyTorch autocast 建模（FP32 权重 + FP32 梯度 + FP32 的 m、v，也是 16 字节/参数，另有 autocast 缓存的 16 位权重副本）；ZeRO 1–3 按 DeepSpeed 的做法建模（16 位权重和梯度，FP32 主权重放进优化器状态）。

# %% tags=["zero_est"]
rows = [("gpt2-small", 8, 512), ("llama-7b", 1, 1024)]
from vramlab.estimate import PHASE_ZH      # 估算器给每个峰值时刻的中文名
print(cell("模型", 12, True), cell("ZeRO", 5), cell("模型状态（公式）", 17), cell("估算峰值", 10), cell("峰值时刻", 12))
print(cell("", 12, True), cell("", 5), cell("GiB", 17), cell("GiB", 10))
est_table = {}
for model, b, s in rows:
    psi = param_count(model)
    for z in range(4):
        e = estimate(Workload(model=model, batch=b, seq=s, precision="bf16-mixed", zero=z, gpus=8))
        est_table[(model, z)] = e
        print(cell(model, 12, True), cell(z, 5), cell(f"{zero_model_state_bytes(psi, z, 8) / GiB:.2f}", 17),
              cell(f"{e.total_bytes / GiB:.2f}", 10), cell(PHASE_ZH[e.peak_phase], 12))
        key = model.replace("-", "_")
        publish(f"{key}_z{z}_state_gib", zero_model_state_bytes(psi, z, 8) / GiB, fmt="{:.2f}")
        publish(f"{key}_z{z}_peak_gib", e.total_bytes / GiB, fmt="{:.2f}")
    if model == "gpt2-small":          # 正文对照：PyTorch 的 ZeroRedundancyOptimizer 加 autocast 时 ZeRO-1 是 9Ψ 字节
        publish("gpt2_small_zero1_autocast_gib", 9 * psi / GiB, fmt="{:.2f}")
    print(f"  {model}：{psi:,} 个参数，批大小 {b}，序列长度 {s}")

# %% [markdown]
# 几点读法：
#
# - “模型状态（公式）”一列就是 `zero_model_state_bytes(Ψ, stage, 8)`；“估算峰值”是四个时刻（前向末尾、反向开始、反向末尾、优化器 step）里最大的那个，包含激活值、logits、临时张量和 cuBLAS 工作区。
# - Llama-7B 在 ZeRO 0 下，光模型状态就是 100.41 GiB，估算峰值 125.58 GiB，已经逼近一张 H200 的 141 GB（≈ 131.3 GiB），CUDA 上下文和碎片还没算；ZeRO 3 把峰值压到 18.38 GiB。ZeRO 1 → 2 峰值时刻从“优化器 step”挪到了“反向开始”：梯度切开之后，最大的时刻变成了激活值最多的时候。
# - GPT-2 small 在 ZeRO 3 下模型状态只剩 0.23 GiB，峰值 5.57 GiB 几乎全是激活值和 logits：再往上加卡，每卡的峰值几乎不再下降。数据并行切的只是模型状态，激活值要靠第 7 章的检查点等办法。
#
# 命令行里是同一个估算器，`--zero N --gpus M` 两个参数：

# %%
cli = [sys.executable, "-c", "import sys; from vramlab.cli import main; sys.exit(main())"]
out = subprocess.run(cli + ["estimate", "--model", "llama-7b", "--batch", "1", "--seq", "1024",
                            "--precision", "bf16-mixed", "--zero", "3", "--gpus", "8"],
                     capture_output=True, text=True, check=True).stdout
for line in out.splitlines():   # 每行后面的中文说明太长，只保留到“占比”一列
    print(line[:line.index("%") + 1] if "%" in line else line)

# %% [markdown]
# 再看 DDP 每张卡上的真实情况：DDP 不切任何东西，**每张卡的峰值就是单卡训练的峰值**。H200 参考数据里 GPT-2 small、BF16 autocast、批大小 8、序列长度 512 的稳态峰值是 7141 MiB（`vramlab/data/h200_gpt2_peaks.md`，PyTorch 2.11.0+cu130）。在模拟设备上（FakeTensorMode，只算形状）复现这一行：

# %%
t0 = time.perf_counter()
ref = measure_workload(from_reference_name("small_bf16autocast_adamw_b8_s512"),
                                      backend=backend, fake=(backend == "sim"))
e0 = est_table[("gpt2-small", 0)]
from vramlab.reference import reference_rows

h200 = {r.name: r for r in reference_rows()}["small_bf16autocast_adamw_b8_s512"].steady_mib
print(f"H200 参考（max_memory_allocated）：{h200} MiB")
print(f"{'模拟设备（FakeTensorMode）' if backend == 'sim' else 'CUDA'} 稳态峰值：{ref.peak_bytes / MiB:.0f} MiB")
print(f"估算器（ZeRO 0）：{e0.total_bytes / MiB:.0f} MiB")
publish("h200_autocast_mib", h200)
publish("sim_autocast_mib", ref.peak_bytes / MiB, fmt="{:.0f}")
publish("est_autocast_mib", e0.total_bytes / MiB, fmt="{:.0f}")

# %% [markdown]
# 三个数字对得上：这就是“用 DDP 把 GPT-2 small 扩到 8 张卡”时每张卡要装的量，一分都不会少。
#
# ## 3. 两个 gloo 进程：DDP、ZeRO-1 与 FSDP2 各存了多少
#
# 下面的 `worker` 在每个进程里运行：连上 `127.0.0.1` 的一个空闲端口，`init_process_group("gloo")`，然后依次用五种方式训练同一个 `tiny` 模型（GPT-2 结构，2 层、隐藏维度 128、词表 1024，59 万参数，FP32 + AdamW）两步，每个 rank 喂不同的数据。模型很小，是为了在两个 CPU 核上几十秒内跑完；要数的是字节，模型大小不影响结论：
#
# | 名称 | 写法 |
# |---|---|
# | `ddp` | `DistributedDataParallel(model)`，默认 `bucket_cap_mb=25`、`gradient_as_bucket_view=False` |
# | `ddp_view` | `DistributedDataParallel(model, gradient_as_bucket_view=True)` |
# | `ddp_zero1` | DDP + `ZeroRedundancyOptimizer(..., optimizer_class=torch.optim.AdamW)` |
# | `fsdp2_keep` | 每个 Transformer 块和根模块 `fully_shard(..., reshard_after_forward=False)` |
# | `fsdp2` | 同上，`reshard_after_forward=True`（前向后立刻释放完整参数） |
#
# 第二步 `optimizer.step()` 之后（梯度还在），数出本 rank 上参数、梯度、优化器状态三类张量的存储字节。进程用 `fork` 启动（Linux；notebook 里定义的函数不能用 `spawn` 传给子进程），每个进程只用 1 个线程。

# %%
MODEL, B, T = "tiny", 4, 64


def local_bytes(tensors):
    """本 rank 上这些张量的存储字节数；DTensor 取本地分片；同一块存储只算一次。"""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def wrap(kind, model, mesh=None):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    if kind.startswith("ddp"):
        m = DDP(model, gradient_as_bucket_view=(kind == "ddp_view"))
        if kind == "ddp_zero1":
            return m, ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-3)
    keep = kind == "fsdp2_keep"
    for block in model.transformer.h:                 # 自底向上：先每个块，再根模块
        fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def ghost_bytes(dev):
    """模拟设备还记着、但存储实际已被 resize_(0) 释放的字节数（FSDP2 这样释放完整参数）。"""
    return sum(r.charged for r in dev.tracker.live.values() if r.ref() is not None and r.ref().nbytes() == 0)


@torch.no_grad()
def param_sum(params):
    """全部参数之和；FSDP2 的 DTensor 先 full_tensor() 拼回完整参数。"""
    return float(sum((p.full_tensor() if hasattr(p, "full_tensor") else p).double().sum() for p in params))


def train_one(kind, rank, steps=2, model_name=MODEL, mesh=None):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        model = build_model(model_name)              # 同一个种子：每个 rank 初始权重相同
        m, opt = wrap(kind, model, mesh)
        g = torch.Generator().manual_seed(100 + rank)   # 每个 rank 不同的数据
        losses = []
        for step in range(steps):
            ids = torch.randint(0, 1000, (B, T), generator=g)
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(round(loss.detach().item(), 4))
            if step < steps - 1:
                opt.zero_grad(set_to_none=True)
        params = list(m.parameters())
        state = opt.optim.state if kind == "ddp_zero1" else opt.state
        r = dict(p=local_bytes(params), g=local_bytes(p.grad for p in params),
                 s=local_bytes(v for st in state.values() for v in st.values()
                               if torch.is_tensor(v) and v.dim() > 0),
                 sim_alloc=dev.allocated(), ghost=ghost_bytes(dev), losses=losses,
                 wsum=param_sum(params))
        opt.zero_grad(set_to_none=True)
        del m, opt, model
    return r


def worker(rank, world, port, kinds, queue, mesh_shape=None):
    import warnings
    warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = None
        if mesh_shape is not None:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
        out = {}
        for kind in kinds:
            out[kind] = train_one(kind, rank, model_name=MODEL, mesh=mesh)
        queue.put((rank, out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(kinds, world=2, mesh_shape=None):
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    pc = mp.start_processes(worker, args=(world, free_port(), kinds, queue, mesh_shape),
                            nprocs=world, start_method="fork", join=False)
    results = dict(queue.get() for _ in range(world))
    pc.join()
    return results


KINDS = ["ddp", "ddp_view", "ddp_zero1", "fsdp2_keep", "fsdp2"]
t0 = time.perf_counter()
res = launch(KINDS)
print(f"2 个 rank 都已返回（{len(KINDS)} 种写法）。")

# %% [markdown]
# 先确认五种写法训练的是同一件事：每个 rank 的损失、两步之后全部参数之和（FSDP2 先 `full_tensor()` 拼回完整参数）都应当相同。

# %%
for rank in (0, 1):
    print(f"rank {rank}：")
    for kind in KINDS:
        r = res[rank][kind]
        print(f"  {cell(kind, 11, True)} 损失 {r['losses']}  参数之和 {r['wsum']:.6f}")
same = len({round(res[r][k]["wsum"], 6) for r in (0, 1) for k in KINDS}) == 1
print("五种写法、两个 rank 的参数完全一致：", same)

# %% [markdown]
# 两个 rank 的损失不同（数据不同），但两步之后的参数在 10 个（rank, 写法）组合里完全一样：DDP 的全规约、ZeRO-1 的分片更新再广播、FSDP2 的规约-散射（reduce-scatter）都让每个 rank 得到同一个平均梯度。
#
# 下面是每个 rank 上的模型状态，和公式对照。设 $\Psi$ 为参数量、$N = 2$，FP32 + AdamW 时每个参数是权重 4、梯度 4、$m$ 和 $v$ 各 4 字节：DDP $16\Psi$，ZeRO-1 $8\Psi + 8\Psi/N$，FSDP2 $16\Psi/N$。

# %% tags=["states"]
psi = count_params(MODEL)
N = 2
formula = {"ddp": 16 * psi, "ddp_view": 16 * psi, "ddp_zero1": 8 * psi + 8 * psi / N,
           "fsdp2_keep": 16 * psi / N, "fsdp2": 16 * psi / N}
print(f"{MODEL}：Ψ = {psi:,} 个参数；FP32 权重 4Ψ = {4 * psi / MiB:.2f} MiB")
print(cell("写法", 11, True), cell("rank", 5), cell("参数", 9), cell("梯度", 9), cell("优化器状态", 11),
      cell("合计", 9), cell("公式", 9))
print(cell("", 11, True), cell("", 5), *[cell("MiB", 9)] * 2, cell("MiB", 11), *[cell("MiB", 9)] * 2)
for kind in KINDS:
    for rank in (0, 1):
        r = res[rank][kind]
        tot = r["p"] + r["g"] + r["s"]
        print(cell(kind, 11, True), cell(rank, 5), cell(f"{r['p'] / MiB:.2f}", 9), cell(f"{r['g'] / MiB:.2f}", 9),
              cell(f"{r['s'] / MiB:.2f}", 11), cell(f"{tot / MiB:.2f}", 9), cell(f"{formula[kind] / MiB:.2f}", 9))

# %% [markdown]
# - **DDP**：两个 rank 各存一整份，和 $16\Psi$ 一字不差。`gradient_as_bucket_view` 不改变这三类张量的大小。
# - **FSDP2**：参数、梯度、优化器状态都正好是 DDP 的一半，$16\Psi/2$。`fully_shard` 沿第 0 维用 `torch.chunk` 切每个参数，这个模型每个参数的第 0 维都是偶数，所以没有补齐（padding）。
# - **ZeRO-1**（`ZeroRedundancyOptimizer`）：参数和梯度与 DDP 一样是整份，只有优化器状态减半，和 $8\Psi + 8\Psi/N$ 相符。
#
# ZeRO-1 这一行在 `tiny` 上正好均分，但这是运气。`ZeroRedundancyOptimizer` 按**整个参数张量**分给各个 rank：先把参数按元素个数从大到小排序，再依次交给当前总量最小的 rank（见 `torch/distributed/optim/zero_redundancy_optimizer.py` 的 `_partition_parameters`），不切开单个张量。用同样的规则在 meta 设备上（不占内存）给 `gpt2-mini` 和 `gpt2-small` 分一下：

# %% tags=["partition"]
def zero1_partition(model_name, world):
    m = build_model(model_name, device="meta")
    sizes = [0] * world
    for prm in sorted(m.parameters(), key=lambda t: t.numel(), reverse=True):
        sizes[sizes.index(min(sizes))] += prm.numel()
    return sizes, max(prm.numel() for prm in m.parameters()), sum(sizes)

print(cell("模型", 12, True), cell("N", 3), cell("最大张量（参数个数）", 22), cell("各 rank 的 AdamW 状态 MiB", 40),
      cell("均分 MiB", 9))
for name, world in (("gpt2-mini", 2), ("gpt2-small", 8)):
    sizes, biggest, total = zero1_partition(name, world)
    per = " / ".join(f"{8 * x / MiB:.1f}" for x in sizes)
    print(cell(name, 12, True), cell(world, 3), cell(f"{biggest:,}", 22), cell(per, 40), cell(f"{8 * total / world / MiB:.1f}", 9))
    key = name.replace("-", "_")
    publish(f"{key}_partition_max_mib", 8 * max(sizes) / MiB, fmt="{:.1f}")
    publish(f"{key}_partition_mean_mib", 8 * total / world / MiB, fmt="{:.1f}")
    publish(f"{key}_partition_max_vs_mean", max(sizes) / (total / world), fmt="{:.1f}")

# %% [markdown]
# GPT-2 的词嵌入（50257 × 隐藏维度）是全模型最大的一个张量，输出层又和它共享权重：`gpt2-mini` 的词嵌入占了全部参数的三分之二，它的 $m$、$v$ 整个落在一个 rank 上，那个 rank 的优化器状态远高于平均值；其余 rank 反而更少。显存是否溢出看的是**最满的那张卡**，所以用 ZeRO-1 估算时要用最大的那份，而不是公式里的平均值 $K\Psi/N$。FSDP2 和 DeepSpeed 的 ZeRO 把每个张量都切开（FSDP2 沿第 0 维 `torch.chunk`），没有这个问题。
#
# 再看每个 rank 里的模拟设备记到的“第二步之后仍然分配着”的字节数（只列 DDP 的三种写法，FSDP2 的原因见表后）。它比上表多出的部分，是 DDP 的梯度桶（bucket）：

# %%
print(cell("写法", 11, True), cell("rank", 5), cell("三类张量", 10), cell("模拟设备已分配", 15), cell("差值", 9))
print(cell("", 11, True), cell("", 5), cell("MiB", 10), cell("MiB", 15), cell("MiB", 9))
for kind in ("ddp", "ddp_view", "ddp_zero1"):
    for rank in (0, 1):
        r = res[rank][kind]
        tot = r["p"] + r["g"] + r["s"]
        print(cell(kind, 11, True), cell(rank, 5), cell(f"{tot / MiB:.2f}", 10), cell(f"{r['sim_alloc'] / MiB:.2f}", 15),
              cell(f"{(r['sim_alloc'] - tot) / MiB:.2f}", 9))
        if rank == 0:
            publish(f"{kind}_bucket_extra_mib", (r["sim_alloc"] - tot) / MiB, fmt="{:.2f}")
print(f"\n参考：FP32 梯度总量 4Ψ = {4 * psi / MiB:.2f} MiB")
publish("tiny_grad_mib", 4 * psi / MiB, fmt="{:.2f}")
r = res[0]["fsdp2"]
print(f"FSDP2（rank 0）：三类张量 {(r['p'] + r['g'] + r['s']) / MiB:.2f} MiB，模拟设备却记着 {r['sim_alloc'] / MiB:.2f} MiB"
      f"，其中存储已被 resize_(0) 的有 {r['ghost'] / MiB:.2f} MiB")
publish("fsdp2_states_mib", (r["p"] + r["g"] + r["s"]) / MiB, fmt="{:.2f}")
publish("fsdp2_sim_alloc_mib", r["sim_alloc"] / MiB, fmt="{:.2f}")
publish("fsdp2_sim_extra_mib", (r["sim_alloc"] - r["p"] - r["g"] - r["s"]) / MiB, fmt="{:.2f}")
publish("fsdp2_ghost_mib", r["ghost"] / MiB, fmt="{:.2f}")

# %% [markdown]
# - `ddp` 比三类张量多出约一份梯度（4Ψ，再加上分配器的取整）：DDP 在桶里另存了一份梯度用于全规约，反向时再把结果拷回 `.grad`。`ddp_view` 让 `.grad` 直接成为桶的视图，这一份就没了，和 PyTorch 文档说的“省下的显存等于梯度总量”一致。`ddp_zero1` 也带着这份桶。
# - FSDP2 为什么不列：FSDP2 用 `untyped_storage().resize_(0)` 释放前向、反向时拼出来的完整参数（`torch/distributed/fsdp/_fully_shard/_fsdp_param.py` 里的 `free_storage`）。这个调用不是 aten 算子，模拟设备专门拦截了它，所以最后一行“存储已被 `resize_(0)`、模拟设备仍记着”的字节数是 0。但模拟设备记到的总数仍比三类张量多出一些（两个进程时约 4Ψ）：原因是模拟设备把 AdamW 的 `exp_avg`、`exp_avg_sq` 按完整大小记账。`torch.zeros_like(p)` 对 DTensor 参数返回 DTensor，它自己的存储报告的是完整张量的大小，真正的本地分片分配在模拟设备看不到的地方（脚本 `scripts/probes/ch10_fsdp_optimizer_state.py`，见第 10 章正文的说明框）。这是模拟设备的偏差，所以本教程对 FSDP2 以“数本地分片”为准，以上一张表为准。
#
# 把每个 rank 的三类张量画成堆叠柱状图：

# %%
import matplotlib
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框

fig, ax = plt.subplots(figsize=(9, 4.2))
labels = [f"{k}\nrank {r}" for k in KINDS for r in (0, 1)]
bottom = [0.0] * len(labels)
for key, zh, en in (("p", "参数", "parameters"), ("g", "梯度", "gradients"), ("s", "优化器状态", "optimizer state")):
    vals = [res[r][k][key] / MiB for k in KINDS for r in (0, 1)]
    ax.bar(labels, vals, bottom=bottom, label=zh if ZH else en)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax.axhline(16 * psi / MiB, color="gray", ls="--", lw=1)
ax.axhline(16 * psi / N / MiB, color="gray", ls=":", lw=1)
ax.set_ylabel("每个 rank 的字节 (MiB)" if ZH else "bytes per rank (MiB)")
ax.set_title("tiny（GPT-2 结构），FP32 + AdamW，2 个 gloo 进程" if ZH else "tiny (GPT-2), FP32 + AdamW, 2 gloo ranks")
ax.tick_params(axis="x", labelsize=8)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 虚线是 $16\Psi$（DDP），点线是 $16\Psi/2$（完全分片）。ZeRO-1 的两根柱子在 `tiny` 上一样高，是因为这个模型碰巧能均分；换成 `gpt2-mini`，按上面的分配表，rank 0 的优化器状态会几乎是 rank 1 的两倍。
#
# ## 4. 混合分片（HSDP）：4 个进程，2×2 的 DeviceMesh
#
# 给 `fully_shard` 传一个二维的 `DeviceMesh`，第 0 维复制（replicate）、第 1 维分片（shard），就是混合分片。这里用 4 个进程排成 2×2：rank 0、1 是一组（相当于“节点 0”里的两张卡），rank 2、3 是另一组。每组内部把参数切成 2 份，两组之间互为副本。模型仍是 `tiny`。

# %%
res_hsdp = launch(["fsdp2"], world=4, mesh_shape=(2, 2))
psi_t = count_params("tiny")
print(f"tiny：Ψ = {psi_t:,}；DDP 每 rank 16Ψ = {16 * psi_t / MiB:.2f} MiB，"
      f"全分片到 4 份 16Ψ/4 = {16 * psi_t / 4 / MiB:.2f} MiB，组内分片到 2 份 16Ψ/2 = {16 * psi_t / 2 / MiB:.2f} MiB")
print(cell("rank", 5), cell("参数 MiB", 10), cell("梯度 MiB", 10), cell("优化器状态 MiB", 15), cell("合计 MiB", 10),
      cell("参数之和", 14))
for rank in range(4):
    r = res_hsdp[rank]["fsdp2"]
    print(cell(rank, 5), cell(f"{r['p'] / MiB:.2f}", 10), cell(f"{r['g'] / MiB:.2f}", 10), cell(f"{r['s'] / MiB:.2f}", 15),
          cell(f"{(r['p'] + r['g'] + r['s']) / MiB:.2f}", 10), cell(f"{r['wsum']:.6f}", 14))
r = res_hsdp[0]["fsdp2"]
for part, key in (("p", "param"), ("g", "grad"), ("s", "state")):
    publish(f"hsdp_{key}_mib", r[part] / MiB, fmt="{:.2f}")
publish("hsdp_total_mib", (r["p"] + r["g"] + r["s"]) / MiB, fmt="{:.2f}")
publish("full_shard_4_mib", 16 * psi_t / 4 / MiB, fmt="{:.2f}")
print(f"\n第 3、4 部分的多进程实验共用时 {time.perf_counter() - t0:.0f} 秒（只作参考，取决于机器负载）")

# %% [markdown]
# 每个 rank 存的是 $16\Psi/2$，而不是 4 个 rank 全分片时的 $16\Psi/4$：混合分片用多一倍的模型状态，换来“参数的全收集（all-gather）和梯度的规约-散射只在组内（节点内）做，组之间只对梯度做一次全规约”。四个 rank 的参数之和仍然相同。
#
# 小结一下本教程测到的东西：DDP 每个 rank 一整份模型状态，外加一份梯度桶；`gradient_as_bucket_view=True` 去掉这份桶；ZeRO-1 只切优化器状态，而且 PyTorch 的实现按张量分配，不一定均匀；FSDP2 把三类张量都切成 $1/N$；混合分片切成 $1/(\text{组内卡数})$。
