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
# # 第 4 章 动手教程：数据加载管线
#
# 这个教程依次做五件事：
#
# 1. 用 `np.memmap` 把一份随机生成的 token 序列写成磁盘上的 `uint16` 文件（和 nanoGPT 的 `train.bin` 同一种格式），再以只读方式映射回来；
# 2. 在它上面写一个 `Dataset`，把 `DataLoader` 的各个环节（采样器、批采样器、取样本、拼批次）逐一拆开看；
# 3. 在本机 CPU 上对几组 `num_workers` / `prefetch_factor` 计时——**只作演示**，换一台机器、换一份负载，结果都会变；
# 4. 看看多进程加载时每个工作进程的随机种子；
# 5. 在模拟设备（或真实 GPU）上对比两种喂数据的方式：训练前把**整个数据集**搬上显卡，和**每步只搬当前批次**，比较峰值显存。
#
# 显存数字来自 `vramlab.open_device("auto")`：有 NVIDIA GPU 时测的是 `torch.cuda.max_memory_allocated()`，没有时是 CPU 上的模拟设备（结果确定，可复现）。

# %%
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, default_collate

import transformers
import vramlab
from vramlab.models import build_model
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

import unicodedata


def cell(text, width, left=False):
    """按显示宽度补空格（一个汉字占两格），让中文表头和数字对齐。"""
    text = str(text)
    w = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    pad = " " * max(width - w, 0)
    return text + pad if left else pad + text


backend = "cuda" if torch.cuda.is_available() else "sim"
transformers.logging.set_verbosity_error()       # 不显示与本章无关的提示
print(f"Python {platform.python_version()} | torch {torch.__version__} | numpy {np.__version__} | {platform.machine()}")
print(f"显存后端：{backend}（{'NVIDIA GPU：' + torch.cuda.get_device_name(0) if backend == 'cuda' else 'CPU 上的模拟设备'}）")
print(f"多进程启动方式：{torch.multiprocessing.get_start_method()}，CPU 核数：{os.cpu_count()}")
publish("date", time.strftime("%Y-%m-%d"))
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 把 token 写成内存映射文件
#
# 语言模型的预训练数据通常先分好词，再把所有 token id 首尾相接，存成一个扁平的整数数组。GPT-2 的词表有 50257 个词，最大 id 是 50256，小于 $2^{16} = 65536$，所以每个 token 用 `uint16`（2 字节）就够了。
#
# 这里用 `np.memmap(..., mode="w+")` 在临时目录里建一个文件，往里写随机 token。教程用的小模型 `tiny` 词表只有 1024，token 就在 `[0, 1024)` 里抽。

# %%
VOCAB = 1024            # tiny 预设的词表大小
N_TOKENS = 8_000_000    # 数据集里的 token 总数
SEQ_LEN = 128           # 每个样本的长度
BATCH = 8

workdir = tempfile.mkdtemp(prefix="ch04_")
path = os.path.join(workdir, "train.bin")

rng = np.random.default_rng(0)
out = np.memmap(path, dtype=np.uint16, mode="w+", shape=(N_TOKENS,))
out[:] = rng.integers(0, VOCAB, size=N_TOKENS, dtype=np.uint16)
out.flush()
del out                  # 写完就关掉：之后只读

size = os.path.getsize(path)
print(f"文件 {os.path.basename(path)}：{N_TOKENS:,} 个 token × 2 字节 = {size:,} 字节 = {size / MiB:.2f} MiB")
print(f"同样的 token 若存成 int64（模型要的索引类型）：{N_TOKENS * 8 / MiB:.2f} MiB")
publish("file_bytes", f"{size:,}")
publish("file_mib", size / MiB, fmt="{:.2f}")
publish("int64_mib", N_TOKENS * 8 / MiB, fmt="{:.2f}")

# %% [markdown]
# 再以只读模式（`mode="r"`）映射回来。映射本身不读数据：操作系统只在你访问某一页时才把它从磁盘读进页缓存（page cache）。切片得到的仍是一个指向文件的 `memmap`，只有 `.astype(np.int64)` 这一步才真正把**这一小段**复制进内存。
#
# `.npy` 文件也一样：`np.load(..., mmap_mode="r")` 读完文件头之后，剩下的部分同样是映射。

# %%
data = np.memmap(path, dtype=np.uint16, mode="r")
piece = data[1000:1000 + SEQ_LEN]
print("整个数组：", type(data).__name__, data.dtype, data.shape, "可写" if data.flags.writeable else "只读")
print("一个切片：", type(piece).__name__, piece.shape)
x = torch.from_numpy(piece.astype(np.int64))      # 复制出 128 个 int64，与文件脱钩
print("转成张量：", x.dtype, tuple(x.shape), f"{x.nbytes} 字节")

npy_path = os.path.join(workdir, "val.npy")
np.save(npy_path, rng.integers(0, VOCAB, size=10_000, dtype=np.uint16))
val = np.load(npy_path, mmap_mode="r")
print(".npy 映射：", type(val).__name__, val.dtype, val.shape)

# %% [markdown]
# ## 2. Dataset 和 DataLoader 的各个环节
#
# 下面的 `TokenDataset` 是一个映射式数据集（map-style dataset）：第 `i` 个样本就是文件里第 `i` 段长 `SEQ_LEN` 的 token。注意两点：
#
# - 映射在**第一次取样本时**才打开（`self._data` 起初是 `None`）。这样每个工作进程各自打开一份映射，父进程里不必先持有它；
# - `__getitem__` 返回的是一个**新复制出来的** `int64` 张量，不直接包装只读映射（`torch.from_numpy` 包装只读数组会给出警告，写它更是未定义行为）。

# %%
class TokenDataset(Dataset):
    def __init__(self, path, seq_len):
        self.path, self.seq_len = path, seq_len
        self.n = (os.path.getsize(path) // 2) // seq_len     # 完整样本的个数
        self._data = None                                      # 每个进程第一次用时再打开

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = i * self.seq_len
        return torch.from_numpy(self._data[s:s + self.seq_len].astype(np.int64))


ds = TokenDataset(path, SEQ_LEN)
print(f"样本数：{len(ds):,}（每个 {SEQ_LEN} 个 token）")

# %% [markdown]
# `DataLoader` 每产出一个批次，要经过“采样器 → 批采样器 → 取样本 → 拼批次”几步。把它们手工串起来，结果和 `DataLoader` 给的完全一样：

# %%
g = torch.Generator().manual_seed(0)
sampler = RandomSampler(ds, generator=g)                      # 1. 采样器：产出样本下标
batch_sampler = BatchSampler(sampler, batch_size=4, drop_last=True)   # 2. 批采样器：把下标攒成一批
first_indices = next(iter(batch_sampler))
samples = [ds[i] for i in first_indices]                     # 3. 取样本（多进程时在工作进程里做）
batch = default_collate(samples)                             # 4. 拼批次（collate_fn，也在工作进程里）
print("第一批的样本下标：", first_indices)
print("拼好的批次：", tuple(batch.shape), batch.dtype)

loader = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
                                                   batch_size=4, drop_last=True))
print("与 DataLoader 给出的第一批相同：", torch.equal(batch, next(iter(loader))))

# 小细节：DataLoader(shuffle=True, generator=g) 在创建迭代器时，会先从 g 里抽一个 base_seed（给工作进程播种用），
# 然后采样器才用 g 打乱顺序，所以它的顺序和“同一个种子的裸 RandomSampler”并不相同
loader2 = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
print("与 DataLoader(shuffle=True, generator=同一种子) 的第一批相同：", torch.equal(batch, next(iter(loader2))))

# %% [markdown]
# ## 3. 预取：同时在路上的批次数
#
# `num_workers > 0` 时，每个工作进程最多同时领 `prefetch_factor` 个批次的任务（默认 2），所以主进程之外最多有 $\text{num\_workers} \times \text{prefetch\_factor}$ 个批次在准备或排队。它们占的是**主存**。下表按本教程的批次（`BATCH=8`，`SEQ_LEN=128`，`int64`）算一算：

# %%
batch_bytes = BATCH * SEQ_LEN * 8
print(f"一个批次：{BATCH} × {SEQ_LEN} × 8 字节 = {batch_bytes:,} 字节\n")
print(cell("num_workers", 12) + cell("prefetch_factor", 17) + cell("在路上的批次", 14) + cell("主存 KiB", 10))
for nw, pf in [(1, 2), (2, 2), (2, 4), (8, 2), (8, 4)]:
    n = nw * pf
    print(cell(nw, 12) + cell(pf, 17) + cell(n, 14) + cell(f"{n * batch_bytes / 1024:.0f}", 10))

for nw in (0, 2):
    dl = DataLoader(ds, batch_size=BATCH, num_workers=nw)
    print(f"\nDataLoader(num_workers={nw}).prefetch_factor = {dl.prefetch_factor}", end="")
print()

# %% [markdown]
# ## 4. 在本机上计时（仅作演示）
#
# 真实的数据管线里，取一个样本往往要等磁盘、网络或解码。这里用 `time.sleep` 模拟：每取一个样本等 2 ms（模拟 I/O），每个训练步等 10 ms（模拟 GPU 在算）。`sleep` 不占 CPU，所以这个演示衡量的是“等待能否被重叠”，而不是 CPU 算力。
#
# **下面的秒数只说明这台机器、这份模拟负载上的情况，不能当作结论搬到别处**；你自己的管线要在自己的机器上量。

# %%
class SlowTokenDataset(TokenDataset):
    def __getitem__(self, i):
        time.sleep(0.002)                       # 模拟读盘 / 解码
        return super().__getitem__(i)


def run_epoch(num_workers, prefetch_factor, n_batches=20):
    slow = SlowTokenDataset(path, SEQ_LEN)
    sub = torch.utils.data.Subset(slow, range(n_batches * BATCH))
    kw = {} if num_workers == 0 else {"prefetch_factor": prefetch_factor}
    dl = DataLoader(sub, batch_size=BATCH, num_workers=num_workers, **kw)
    t0 = time.perf_counter()
    for b in dl:
        time.sleep(0.010)                       # 模拟一个训练步
    return time.perf_counter() - t0


configs = [(0, None), (1, 2), (2, 2), (2, 4)]
print(cell("num_workers", 12) + cell("prefetch_factor", 17) + cell("20 个批次用时 s", 18))
for nw, pf in configs:
    print(cell(nw, 12) + cell(pf, 17) + cell(f"{run_epoch(nw, pf):.2f}", 18))
print("\n（本机 CPU 上的演示计时，每次运行都会不同）")

# %% [markdown]
# ## 5. 工作进程的随机种子
#
# 每个工作进程的 PyTorch 种子是 `base_seed + worker_id`，`base_seed` 由主进程的随机数发生器（或你传入的 `generator`）在每次创建迭代器时生成；PyTorch 也用它为工作进程里的 `random` 和 `numpy.random` 播种。下面让每个样本报告“我是哪个工作进程产出的、拿到的随机数是多少”：

# %%
class WhoAmI(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return i, info.id, info.seed, int(torch.randint(0, 1000, ())), int(np.random.randint(0, 1000))


def show_worker_seeds(worker_id):              # worker_init_fn：在播种之后、取数据之前调用
    info = torch.utils.data.get_worker_info()
    assert info.id == worker_id and torch.initial_seed() == info.seed


dl = DataLoader(WhoAmI(), batch_size=None, num_workers=2, worker_init_fn=show_worker_seeds,
                generator=torch.Generator().manual_seed(42))
for epoch in range(2):
    print(f"epoch {epoch}:")
    for i, wid, seed, r_torch, r_np in dl:
        print(f"  样本 {i}  工作进程 {wid}  种子 …{seed % 10**6:06d}  torch 随机数 {r_torch:3d}  numpy 随机数 {r_np:3d}")

# %% [markdown]
# 两个工作进程拿到不同的种子，随机数也不同；第二个 epoch 重新创建了工作进程（`persistent_workers=False`），`base_seed` 也换了一个。
#
# ## 6. 数据管线与显存：整个数据集上显卡，还是每步一个批次？
#
# 先在主存里准备好整份 `int64` token（在设备上下文**之外**创建，所以它是主存，不算显存）。然后写两个训练函数，签名相同，都按顺序取前 `STEPS` 个批次训练：
#
# - `train_whole_upfront`：一上来就把整个数据集 `to_device`，再在显卡上切批次——很多入门代码这么写；
# - `train_per_batch`：`DataLoader` 在主存里拼好批次，每步只把**当前批次**搬上显卡。
#
# `dev.to_device(t)` 在 GPU 上就是 `t.to("cuda", non_blocking=True)`，在模拟设备上是一次计入显存的复制；模拟设备上，`DataLoader` 拼批次要放在 `dev.host()` 里，表示那是主存里的张量（在 GPU 上 `dev.host()` 什么也不做）。

# %% tags=["compare"]
STEPS = 3
all_tokens = torch.from_numpy(np.asarray(data[: (N_TOKENS // SEQ_LEN) * SEQ_LEN], dtype=np.int64))
print(f"主存里的整份数据：{tuple(all_tokens.shape)} {all_tokens.dtype}，{all_tokens.nbytes / MiB:.2f} MiB")


def train_whole_upfront(model, optimizer, dataset_tokens, dev, batch_size):
    on_dev = dev.to_device(dataset_tokens)               # 整个数据集进了显存
    seqs = on_dev.view(-1, SEQ_LEN)
    losses = []
    for step in range(STEPS):
        b = seqs[step * batch_size:(step + 1) * batch_size]
        loss = model(input_ids=b, labels=b).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def train_per_batch(model, optimizer, dataset_tokens, dev, batch_size):
    seqs = dataset_tokens.view(-1, SEQ_LEN)               # 仍在主存
    loader = DataLoader(seqs, batch_size=batch_size, shuffle=False,
                        pin_memory=(dev.backend == "cuda"))   # GPU 上用锁页内存，配合 non_blocking
    it = iter(loader)
    losses = []
    for step in range(STEPS):
        with dev.host():                                   # 拼批次发生在主存里
            host_batch = next(it)
        b = dev.to_device(host_batch)                      # 只有这一批进显存
        loss = model(input_ids=b, labels=b).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del b, loss
    return losses


results = {}
for fn in (train_whole_upfront, train_per_batch):
    with vramlab.open_device("auto") as dev:
        model = build_model("tiny", seed=0, device=dev.torch_device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        dev.reset_peak()
        losses = fn(model, optimizer, all_tokens, dev, BATCH)
        dev.synchronize()
        results[fn.__name__] = dict(peak=dev.max_allocated(), breakdown=dev.breakdown(),
                                    timeline=[p["allocated"] for p in dev.snapshot()["timeline"]], losses=losses)
        del model, optimizer

whole, per = results["train_whole_upfront"], results["train_per_batch"]
print("\n" + cell("方式", 22, left=True) + cell("峰值显存 MiB", 14) + f"   损失（前 {STEPS} 步）")
for name, r in results.items():
    print(cell(name, 22, left=True) + cell(f"{r['peak'] / MiB:.2f}", 14) + "   "
          + ", ".join(f"{v:.4f}" for v in r["losses"]))
print(f"\n每步一个批次 / 整个数据集上显卡 = {per['peak'] / whole['peak']:.2f}")
print("两种方式的损失完全相同：", whole["losses"] == per["losses"])
publish("peak_whole_mib", whole["peak"] / MiB, fmt="{:.2f}")
publish("peak_per_batch_mib", per["peak"] / MiB, fmt="{:.2f}")
publish("peak_ratio", per["peak"] / whole["peak"], fmt="{:.2f}")
publish("peak_diff_mib", (whole["peak"] - per["peak"]) / MiB, fmt="{:.2f}")

# %% [markdown]
# 在模拟设备上，`dev.breakdown()` 给出峰值那一刻显存里各类张量各占多少。数据集在训练开始之前就被复制上来了，不属于参数、梯度、优化器状态或激活值，记在“其他”（`other`）里：

# %% tags=["breakdown"]
names = {"parameters": "参数", "gradients": "梯度", "optimizer_state": "优化器状态", "activations": "激活值",
         "temporaries": "临时张量", "cuda_overhead": "cuBLAS 工作区", "other": "其他（含数据集）"}
if whole["breakdown"]:
    print(cell("类别", 18, left=True) + cell("整个数据集 MiB", 16) + cell("每步一批 MiB", 14))
    for k, zh in names.items():
        print(cell(zh, 18, left=True) + cell(f"{whole['breakdown'].get(k, 0) / MiB:.2f}", 16)
              + cell(f"{per['breakdown'].get(k, 0) / MiB:.2f}", 14))
    publish("dataset_on_device_mib", whole["breakdown"].get("other", 0) / MiB, fmt="{:.2f}")
    publish("batch_on_device_mib", per["breakdown"].get("other", 0) / MiB, fmt="{:.2f}")
    publish("cublas_each_mib", whole["breakdown"].get("cuda_overhead", 0) / 2 / MiB, fmt="{:.0f}")
else:
    print("真实 GPU 上没有按类别的分解（CUDA 分配器不知道张量的用途）")

# %% [markdown]
# 两次运行的“已分配显存”随分配事件变化的曲线（模拟设备记录了每一次分配和释放；真实 GPU 上没有这条时间线）：

# %%
import matplotlib.pyplot as plt
from matplotlib import font_manager

cjk = [f.name for f in font_manager.fontManager.ttflist if f.name in ("Noto Sans CJK SC", "Noto Sans CJK JP")]
if cjk:
    plt.rcParams["font.family"] = [cjk[0], "DejaVu Sans"]
label = (lambda zh, en: zh) if cjk else (lambda zh, en: en)

if whole["timeline"]:
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot([a / MiB for a in whole["timeline"]], label=label("整个数据集先上显卡", "whole dataset moved up front"))
    ax.plot([a / MiB for a in per["timeline"]], label=label("每步只搬当前批次", "one batch per step"))
    ax.set_xlabel(label("分配 / 释放事件序号", "allocation event #"))
    ax.set_ylabel(label("已分配显存（MiB）", "allocated (MiB)"))
    ax.set_title(label(f"tiny 模型，batch {BATCH}，序列 {SEQ_LEN}，{STEPS} 步（模拟设备）",
                       f"tiny model, batch {BATCH}, seq {SEQ_LEN}, {STEPS} steps (simulated device)"))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    plt.show()
    plt.close(fig)

# %% [markdown]
# 两条曲线的形状一样，差别是整整一条“台阶”：整个数据集的大小。这个差距不随模型变化，只随数据集变大：本教程只有 800 万个 token，而 nanoGPT 准备的 OpenWebText 训练集约 90 亿个 token，存成 `int64` 要 72 GB 以上，任何一张显卡都放不下。
#
# 最后清理临时文件：

# %%
import shutil

del data, val
shutil.rmtree(workdir)
print("已删除", workdir)
