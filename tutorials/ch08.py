# %% [markdown]
# # 第 8 章 动手教程：梯度通信的显存账与字节账
#
# 这份教程配合[第 8 章 梯度压缩与通信优化](ch08.md)，回答四个问题：
#
# 1. **Ring AllReduce 每个 rank 发多少字节？** 在一个进程里模拟 $N$ 个 rank，按“规约-散射 + 全收集”两段走完一圈，数出每个 rank 发出的字节，和公式 $2(N-1)/N \times S$ 对照。
# 2. **TopK（带误差反馈）和 QSGD 省了多少通信、又多占了多少显存？** 在本机设备上（`vramlab.open_device("auto")`：有 NVIDIA GPU 用真卡，否则用 CPU 上的模拟设备）压缩一个真实的梯度，数“要发的字节”，量“压缩多占的显存”。再用数值实验验证 QSGD 无偏、误差反馈不丢信息。
# 3. **梯度怎么全规约最省显存？** 在 CPU 上用 `torch.multiprocessing` 启动 **2 个 gloo 进程**，用七种写法训练同一个小模型：把全部梯度 `torch.cat` 成一个扁平缓冲区、逐参数原地全规约、分桶、用钩子与反向重叠、DDP（默认 / `gradient_as_bucket_view=True`）、DDP 加 `fp16_compress_hook`。逐个 rank 量稳态峰值、数每步发出的字节，并确认七种写法训练出完全相同（或在压缩误差内相同）的参数。
# 4. **梯度累积时怎么少通信？** 用 DDP 的 `no_sync()` 累积 4 个微批次，数全规约的次数和字节。
#
# 第 3、4 部分在每个进程里套一个 `vramlab.SimDevice`（模拟设备）量峰值：gloo 只能在 CPU 上跑，所以即使在 GPU 机器上，这两部分也在模拟设备上统计。

# %%
import datetime
import gc
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

import vramlab
from vramlab.display import banner, pad, mib, free_port
from vramlab.models import build_model, count_params
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值
from vramlab.units import MiB

transformers.logging.set_verbosity_error()
ON_GPU = banner()
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)
T_START = time.perf_counter()

# %% [markdown]
# ## 1. Ring AllReduce：每个 rank 发出 $2(N-1)/N$ 份数据
#
# 下面的 `ring_allreduce` 在一个进程里模拟 $N$ 个 rank 排成一个环。每个 rank 把自己的梯度切成 $N$ 块：
#
# - **规约-散射（reduce-scatter）**：共 $N-1$ 步，第 $t$ 步里 rank $i$ 把第 $(i-t) \bmod N$ 块发给右邻居，右邻居把收到的块加到自己那一块上。$N-1$ 步之后，rank $i$ 手里的第 $(i+1) \bmod N$ 块是所有 rank 之和。
# - **全收集（all-gather）**：再走 $N-1$ 步，每个 rank 把已经求和完毕的块传给右邻居，右邻居直接覆盖。结束时人人拿到完整的和。
#
# 每一步每个 rank 只发一块（$S/N$ 字节），两段共 $2(N-1)$ 步。

# %%
def ring_allreduce(grads):
    """模拟环形全规约。grads: N 个等长的一维张量（每个 rank 一份）。返回 (结果列表, 每个 rank 发出的字节数)。"""
    n = len(grads)
    chunks = [list(g.clone().chunk(n)) for g in grads]
    sent = [0] * n
    for t in range(n - 1):                                     # 规约-散射
        msgs = [(i, (i - t) % n, chunks[i][(i - t) % n].clone()) for i in range(n)]
        for i, c, data in msgs:
            sent[i] += data.numel() * data.element_size()
            chunks[(i + 1) % n][c] += data
    for t in range(n - 1):                                     # 全收集
        msgs = [(i, (i + 1 - t) % n, chunks[i][(i + 1 - t) % n].clone()) for i in range(n)]
        for i, c, data in msgs:
            sent[i] += data.numel() * data.element_size()
            chunks[(i + 1) % n][c] = data
    return [torch.cat(c) for c in chunks], sent


torch.manual_seed(0)
L = 1 << 16                                         # 每个 rank 一个 65536 元素的 FP32 梯度（256 KiB）
print(pad("N", 4), pad("每 rank 发出（实测）", 22), pad("公式 2(N-1)/N·S", 18), pad("结果正确", 8))
for n in (2, 4, 8):
    grads = [torch.randn(L) for _ in range(n)]
    out, sent = ring_allreduce(grads)
    ok = all(torch.allclose(o, sum(grads), atol=1e-5) for o in out)
    S = L * 4
    print(pad(str(n), 4), pad(f"{sent[0]:,} 字节", 22), pad(f"{2 * (n - 1) * S // n:,} 字节", 18), ok,
          "（各 rank 相同）" if len(set(sent)) == 1 else sent)
    publish(f"ring_sent_n{n}", f"{sent[0]:,}")

# %% [markdown]
# 数出来的字节和公式一字不差，而且每个 rank 发得一样多。把 $S$ 换成 GPT-2 small 的 FP32 梯度（124,439,808 个参数 × 4 字节），和“参数服务器”（所有 rank 把梯度发给一台中心节点，中心求和后再发回）对比：

# %%
psi_small = count_params("gpt2-small")
S = 4 * psi_small
print(f"GPT-2 small：Ψ = {psi_small:,}，FP32 梯度 S = {mib(S):.1f} MiB\n")
print(pad("N", 5), pad("Ring：每 rank 发出 MiB", 24), pad("是 S 的几倍", 12), pad("参数服务器：中心节点收+发 MiB", 30))
for n in (2, 4, 8, 16, 64, 1024):
    ring = 2 * (n - 1) / n * S
    print(pad(str(n), 5), pad(f"{mib(ring):.1f}", 24), pad(f"{ring / S:.3f}", 12), pad(f"{mib(2 * (n - 1) * S):,.0f}", 30))

# %% [markdown]
# Ring 的每 rank 通信量随 $N$ 增长趋近 $2S$，几乎与卡数无关；中心节点的流量却随 $N$ 线性增长。这就是 Ring AllReduce 被称为“带宽最优”的原因。注意这张表算的是**通信字节**，不是显存：NCCL 这样的库在每一步只需要一块大小的暂存区，全规约本身是在梯度张量上原地完成的。

# %% [markdown]
# ## 2. 梯度压缩：TopK + 误差反馈、QSGD
#
# 先拿一个真实的梯度：`tiny` 模型（GPT-2 结构，593,408 个参数）在一个批次上反向一次，把全部梯度拼成一个一维向量 $g$。下面所有压缩都作用在这个 $g$ 上。

# %%
torch.manual_seed(0)
model = build_model("tiny")
ids = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(1))
model(input_ids=ids, labels=ids).loss.backward()
g_cpu = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
del model
n_elem = g_cpu.numel()
print(f"梯度 g：{n_elem:,} 个 FP32 元素，{mib(g_cpu.nbytes):.3f} MiB")
publish("tiny_grad_mib", mib(g_cpu.nbytes), fmt="{:.3f}")


# %% [markdown]
# 两个压缩器：
#
# - **TopK + 误差反馈**：本地维护残差 $e$（与梯度同形状）。每步先把残差加回来 $a = g + e$，只发送 $|a|$ 最大的 $k$ 个元素（值 + 下标），没发出去的部分留作下一步的残差 $e \leftarrow a - \text{TopK}(a)$。
# - **QSGD**（$s$ 个量化级别）：发送 $\|g\|_2$ 一个数，外加每个元素的符号和一个 $0..s$ 之间的整数级别 $\ell_i$；级别按概率随机取上或下，使 $E[Q(g)] = g$。这里把符号和级别打包进一个 `int8`（$s \le 127$），每元素 1 字节；论文还用 Elias 编码进一步压缩，这里不做。

# %%
def topk_ef(g, residual, ratio):
    """TopK + 误差反馈。返回 (values, indices)；residual 原地更新为没发出去的部分。"""
    residual.add_(g)                                   # a = g + e，直接存在残差缓冲区里
    k = max(1, int(ratio * residual.numel()))
    _, idx = residual.abs().topk(k, sorted=False)      # |a| 是一个与梯度同样大的临时张量
    idx = idx.to(torch.int32)
    val = residual[idx]
    residual[idx] = 0                                  # 发出去的部分从残差里清掉
    return val, idx


def qsgd(g, s, gen=None):
    """QSGD 随机量化。返回 (norm, q)；q 是 int8，|q| 为级别，符号为梯度的符号。"""
    norm = g.norm()
    scaled = g.abs() / norm * s                        # 落在 [0, s]
    low = scaled.floor()
    up = torch.rand(g.shape, generator=gen, device=g.device) < (scaled - low)   # 以 scaled-low 的概率取上一级
    q = (low + up).to(torch.int8) * g.sign().to(torch.int8)
    return norm, q


def qsgd_decode(norm, q, s):
    return norm * q.float() / s


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


# %% [markdown]
# 在本机设备上量：`g` 先放到设备上，`reset_peak()` 之后做一次压缩，看“峰值比压缩前多出多少”（临时缓冲区）和“压缩后还常驻多少”（要发的数据、残差）。TopK 取 1% 和 0.1%，QSGD 取 $s = 15$ 和 $s = 127$。

# %% tags=["compress"]
rows = []
with vramlab.open_device("auto") as dev:
    g = dev.to_device(g_cpu)
    for ratio in (0.01, 0.001):
        residual = torch.zeros_like(g)                 # 误差反馈的残差：一份梯度大小
        base = dev.allocated()
        dev.reset_peak()
        val, idx = topk_ef(g, residual, ratio)
        sent = nbytes(val, idx)
        rows.append((f"TopK {ratio:.1%} + 误差反馈", sent, dev.max_allocated() - base + nbytes(residual),
                     dev.allocated() - base + nbytes(residual), nbytes(residual)))
        del residual, val, idx
    for s in (15, 127):
        base = dev.allocated()
        dev.reset_peak()
        norm, q = qsgd(g, s)
        sent = nbytes(norm, q)
        rows.append((f"QSGD s={s}", sent, dev.max_allocated() - base, dev.allocated() - base, 0))
        del norm, q

dense = g_cpu.nbytes
print(f"稠密 FP32 梯度：{mib(dense):.3f} MiB（{dense:,} 字节）\n")
print(pad("压缩方法", 24), pad("要发的字节", 14), pad("压缩比", 9), pad("压缩时峰值多占 MiB", 20), pad("之后常驻 MiB", 14),
      pad("其中残差 MiB", 12))
for name, sent, peak_extra, live_extra, res in rows:
    print(pad(name, 24), pad(f"{sent:,}", 14), pad(f"{dense / sent:.0f}×", 9), pad(f"{mib(peak_extra):.3f}", 20),
          pad(f"{mib(live_extra):.3f}", 14), pad(f"{mib(res):.3f}", 12))
    key = {"TopK 1.0% + 误差反馈": "topk1", "TopK 0.1% + 误差反馈": "topk01"}.get(name, name.replace("QSGD s=", "qsgd"))
    publish(f"{key}_ratio", dense / sent, fmt="{:.0f}")
    publish(f"{key}_peak_extra_mib", mib(peak_extra), fmt="{:.3f}")
    publish(f"{key}_live_mib", mib(live_extra), fmt="{:.3f}")
    publish(f"{key}_residual_mib", mib(res), fmt="{:.3f}")
    publish(f"{key}_peak_vs_grad", peak_extra / dense, fmt="{:.1f}")

# %% [markdown]
# 读这张表：
#
# - **字节确实少了**：TopK 1% 只发 1% 的元素，但每个元素要带一个 4 字节的下标，所以压缩比是 50×而不是 100×；QSGD 每元素 1 字节，加一个范数，约 4×。
# - **显存一个字节也没省，反而多了**：TopK 的残差是常驻的、与梯度一样大的一份张量（表中“其中残差”一列）；求 $|a|$ 还要一个同样大的临时张量。QSGD 的 `abs`、`floor`、随机数、比较结果都是与梯度同样多元素的临时张量，压缩那一刻的峰值比梯度本身还大好几倍。所以梯度压缩是拿显存和计算换通信带宽，而不是反过来。
#
# 接下来验证两条性质。**QSGD 是无偏的**：对同一个向量独立量化很多次取平均，平均值应当收敛到原向量；单次量化的方差不超过论文给的上界 $\min(n/s^2, \sqrt{n}/s)\,\|g\|_2^2$。

# %%
gen = torch.Generator().manual_seed(0)
v = g_cpu[:4096].clone()
n = v.numel()
for s in (1, 15):
    est = torch.zeros_like(v)
    var = 0.0
    trials = 2000
    for t in range(trials):
        d = qsgd_decode(*qsgd(v, s, gen), s)
        est += d
        var += float((d - v).pow(2).sum())
    est /= trials
    bound = min(n / s**2, n**0.5 / s) * float(v.pow(2).sum())
    print(f"s = {s:3d}：{trials} 次平均的相对误差 ‖mean−g‖/‖g‖ = {float((est - v).norm() / v.norm()):.4f}；"
          f"单次方差 {var / trials:.3e}，上界 {bound:.3e}（实测/上界 = {var / trials / bound:.3f}）")
    publish(f"qsgd{s}_mean_err", float((est - v).norm() / v.norm()), fmt="{:.4f}")
    publish(f"qsgd{s}_var_vs_bound", var / trials / bound, fmt="{:.3f}")

# %% [markdown]
# 平均 2000 次之后，$s = 15$ 的相对误差只剩约 2%，$s = 1$ 的还有约 13%：$s = 1$ 时每个元素只有 $\{-1, 0, 1\}$ 三个取值，单次方差大得多，平均收敛得也慢（误差按 $1/\sqrt{\text{次数}}$ 下降），但期望仍然是原向量。两种 $s$ 的单次方差都在上界之内。
#
# **TopK 需要误差反馈**：TopK 是有偏的，每一步只发最大的那 1%。如果不记残差，小元素永远发不出去。下面模拟 200 步，每步的梯度是一个固定方向加噪声，比较“累计发出的总量”和“累计的真实梯度总量”：

# %%
gen = torch.Generator().manual_seed(0)
base_dir = g_cpu[:65536].clone()
for use_ef in (False, True):
    residual = torch.zeros_like(base_dir)
    sent_sum = torch.zeros_like(base_dir)
    true_sum = torch.zeros_like(base_dir)
    for step in range(200):
        gt = base_dir + 0.5 * base_dir.std() * torch.randn(base_dir.shape, generator=gen)
        true_sum += gt
        if not use_ef:
            residual.zero_()
        val, idx = topk_ef(gt, residual, 0.01)
        sent_sum[idx.long()] += val
    touched = int((sent_sum != 0).sum())
    print(f"{'有' if use_ef else '无'}误差反馈：累计发出与真实总量的相对误差 "
          f"{float((sent_sum - true_sum).norm() / true_sum.norm()):.3f}；"
          f"200 步里被发送过的元素 {touched:,} / {base_dir.numel():,}")
    key = "ef" if use_ef else "no_ef"
    publish(f"topk_{key}_err", float((sent_sum - true_sum).norm() / true_sum.norm()), fmt="{:.3f}")
    publish(f"topk_{key}_touched", f"{touched:,}")

# %% [markdown]
# 没有误差反馈时，每步都是同一批大元素被发出去，其余绝大多数元素从未被发送，累计误差很大；有了误差反馈，小元素在残差里攒够了就会被发出，累计发出的总量与真实总量只差“当前残差”那一点。代价就是那份常驻的残差：**一份梯度大小的显存**。
#
# ## 3. 两个 gloo 进程：七种全规约写法的峰值显存与通信字节
#
# 每个进程连上 `127.0.0.1` 的空闲端口，`init_process_group("gloo")`，然后用七种写法各训练 `tiny`（2 层、隐藏维度 128、词表 1024，FP32 + AdamW）4 步，每个 rank 喂不同的数据（批大小 2、序列长度 32）。每一步之前 `reset_peak()`，取第 4 步的峰值作为**稳态峰值**（前几步还在创建优化器状态和 DDP 的桶）。
#
# | 名称 | 写法 |
# |---|---|
# | `flat` | 反向之后 `torch.cat` 所有梯度成一个扁平缓冲区，全规约一次，再拷回各参数的 `.grad`（评分练习的起始代码就是这样） |
# | `param` | 反向之后逐个参数 `dist.all_reduce(p.grad)`，原地 |
# | `bucket` | 反向之后按 256 KiB 一个桶，每个桶 `torch.cat` 后全规约、拷回、释放 |
# | `hook` | 每个参数注册 `register_post_accumulate_grad_hook`：梯度一算完就发起异步全规约（`async_op=True`），与剩下的反向重叠 |
# | `ddp` | `DistributedDataParallel(model)`，默认 `bucket_cap_mb=25` |
# | `ddp_view` | 同上，`gradient_as_bucket_view=True` |
# | `ddp_fp16` | `ddp` 加 `fp16_compress_hook`：桶先转成 FP16 再全规约 |
#
# 为了数字节，每个进程把 `dist.all_reduce` 包了一层，累加每次调用的张量字节数；DDP 的三行都显式注册了一个 Python 通信钩子（`ddp` 和 `ddp_view` 用与默认行为相同的 `allreduce_hook`），这样它们的全规约也经过这层计数。

# %%
MODEL, B, T, STEPS = "tiny", 2, 32, 4
KINDS = ["flat", "param", "bucket", "hook", "ddp", "ddp_view", "ddp_fp16"]
BUCKET_BYTES = 256 * 1024


COMM = {"bytes": 0, "calls": 0}


def install_counter():
    """把 dist.all_reduce 包一层，数每次调用的字节数（gloo 仍然做真正的通信）。"""
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        COMM["bytes"] += tensor.numel() * tensor.element_size()
        COMM["calls"] += 1
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counted


def make_buckets(params, cap):
    """按反向的大致顺序（参数倒序）分桶，每桶不超过 cap 字节（单个更大的参数自成一桶）。"""
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        if cur and size + p.numel() * p.element_size() > cap:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += p.numel() * p.element_size()
    return buckets + [cur]


def allreduce_flat(params, world):
    flat = torch.cat([p.grad.reshape(-1) for p in params])     # 一整份梯度大小的新缓冲区
    dist.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def wrap(kind, model):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    if not kind.startswith("ddp"):
        return model, None
    m = DDP(model, gradient_as_bucket_view=(kind == "ddp_view"))
    if kind == "ddp_fp16":
        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        m.register_comm_hook(None, default_hooks.allreduce_hook)
    return m, m


def train(kind, rank, world):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        model = build_model(MODEL)                     # 同一个种子：两个 rank 初始权重相同
        params = list(model.parameters())              # 词嵌入与输出层共享权重，parameters() 只列一次
        m, ddp = wrap(kind, model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        works = []
        if kind == "hook":
            def on_grad(p):                            # 这个参数的梯度已累加完毕：立即异步全规约
                works.append(dist.all_reduce(p.grad, async_op=True))
            for p in params:
                p.register_post_accumulate_grad_hook(on_grad)
        buckets = make_buckets(params, BUCKET_BYTES)
        gen = torch.Generator().manual_seed(100 + rank)
        peaks, losses = [], []
        for step in range(STEPS):
            ids = torch.randint(0, 1000, (B, T), generator=gen)
            gc.collect()                               # 先回收上一步留下的循环引用，让各步的峰值可比
            dev.reset_peak()
            COMM.update(bytes=0, calls=0)
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            if kind == "flat":
                allreduce_flat(params, world)
            elif kind == "param":
                for p in params:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            elif kind == "bucket":
                for b in buckets:
                    allreduce_flat(b, world)
            elif kind == "hook":
                for w in works:
                    w.wait()
                works.clear()
                for p in params:
                    p.grad.div_(world)
            opt.step()
            opt.zero_grad()
            peaks.append(dev.max_allocated())
            losses.append(round(loss.item(), 5))
        with torch.no_grad():
            wsum = float(sum(p.double().sum() for p in params))
        out = dict(peak=peaks[-1], peaks=peaks, losses=losses, wsum=wsum, comm=dict(COMM),
                   where=dev.tracker.peak_where)
        del m, ddp, opt, model, params
    return out


def worker(rank, world, port, kinds, task, queue):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        install_counter()
        queue.put((rank, {k: task(k, rank, world) for k in kinds}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(kinds, task, world=2):
    """每种写法用一组新的进程和一个新的进程组：上一种写法留下的钩子、异步通信或 DDP 的状态
    影响不到下一种。某个 rank 崩溃时，5 分钟后报错，而不是一直等下去。"""
    ctx = mp.get_context("fork")
    results = {r: {} for r in range(world)}
    for kind in kinds:
        queue = ctx.Queue()
        pc = mp.start_processes(worker, args=(world, free_port(), [kind], task, queue),
                                nprocs=world, start_method="fork", join=False)
        for _ in range(world):
            rank, out = queue.get(timeout=300)
            results[rank].update(out)
        pc.join()
    return results


t0 = time.perf_counter()
res = launch(KINDS, train)
T_MP = time.perf_counter() - t0
print(f"2 个 rank 都已返回（{len(KINDS)} 种写法）。")

# %% [markdown]
# 先确认七种写法训练的是同一件事：每个 rank 的损失和 4 步之后的参数之和。

# %%
psi = count_params(MODEL)
print(f"{MODEL}：Ψ = {psi:,} 个参数；FP32 梯度 4Ψ = {mib(4 * psi):.3f} MiB\n")
for kind in KINDS:
    r0, r1 = res[0][kind], res[1][kind]
    print(pad(kind, 13), f"rank 0 损失 {r0['losses']}", f" 参数之和 rank0 {r0['wsum']:.6f} rank1 {r1['wsum']:.6f}")
exact = [k for k in KINDS if k != "ddp_fp16"]
print("\n前六种写法、两个 rank 的参数完全一致：", len({round(res[r][k]["wsum"], 9) for r in (0, 1) for k in exact}) == 1)

# %% [markdown]
# 前六种写法（不压缩）在两个 rank 上得到完全相同的参数：逐参数、分桶、钩子重叠改变的只是“什么时候、分几次”全规约，结果一位不差。FP16 压缩钩子让参数略有偏离（FP16 的舍入），但两个 rank 之间仍然一致：压缩之后大家拿到的是同一个近似平均梯度。
#
# 下面是每个 rank 的稳态峰值（第 4 步，模拟设备的 `max_allocated`）和那一步的通信：

# %% tags=["ways"]
ref = res[0]["flat"]["peak"]
print(pad("写法", 14), pad("rank0 峰值", 11), pad("rank1 峰值", 11), pad("相对 flat", 10), pad("全规约次数", 11),
      pad("每步发出 KiB", 13), pad("峰值时刻", 30))
print(pad("", 14), pad("MiB", 11), pad("MiB", 11))
for kind in KINDS:
    r0, r1 = res[0][kind], res[1][kind]
    print(pad(kind, 14), pad(f"{mib(r0['peak']):.3f}", 11), pad(f"{mib(r1['peak']):.3f}", 11),
          pad(f"{r0['peak'] / ref:.3f}", 10), pad(str(r0['comm']['calls']), 11),
          pad(f"{r0['comm']['bytes'] / 1024:.1f}", 13), r0["where"])
    for rank in (0, 1):
        publish(f"{kind}_rank{rank}_mib", mib(res[rank][kind]["peak"]), fmt="{:.3f}")
    publish(f"{kind}_vs_flat", r0["peak"] / ref, fmt="{:.3f}")
    publish(f"{kind}_calls", r0["comm"]["calls"])
    publish(f"{kind}_sent_kib", r0["comm"]["bytes"] / 1024, fmt="{:.1f}")
publish("flat_minus_param_mib", mib(res[0]["flat"]["peak"] - res[0]["param"]["peak"]), fmt="{:.3f}")
publish("hook_minus_param_mib", mib(res[0]["hook"]["peak"] - res[0]["param"]["peak"]), fmt="{:.1f}")
fp16_max = max(mib(res[r]["ddp_fp16"]["peak"]) for r in (0, 1))
ddp_max = max(mib(res[r]["ddp"]["peak"]) for r in (0, 1))
publish("ddp_fp16_max_minus_ddp_mib", fp16_max - ddp_max, fmt="{:.3f}")
gap = mib(res[1]["flat"]["peak"] - res[0]["flat"]["peak"])   # gloo 进程的读数每次运行可能不同：写出这次的比较
publish("flat_rank1_vs_rank0_zh", "与 rank 0 相同" if abs(gap) < 0.0005 else f"比 rank 0 {'高' if gap > 0 else '低'} {abs(gap):.3f} MiB")

# %% [markdown]
# 读法（数字见上表，模拟设备上的 `max_allocated`）：
#
# - `flat` 的峰值出现在 `cat` 那一刻：参数、梯度、AdamW 的 $m$、$v$ 都在，再加一份 `torch.cat` 出来的扁平梯度（$4\Psi$）。`param`、`bucket` 原地全规约，没有这一份，峰值回到反向过程中的最高点。
# - `bucket` 每次只多一个桶（这里不超过 256 KiB；最大的单个参数是 512 KiB 的词嵌入，自成一桶），远小于 `flat` 的一整份；桶越大，这份临时开销越接近 `flat`。
# - `hook` 把全规约挪进反向，和计算重叠；在这个模型上它的峰值比 `param` 高一点（见下一段）。
# - `ddp` 常驻一份与梯度一样大的桶（$4\Psi$），峰值比 `param` 多出约一份梯度，在这个模型上甚至比 `flat` 还高；`ddp_view` 让 `.grad` 成为桶的视图，去掉了这份拷贝，但桶在反向**一开始**就整份在场（逐参数写法的梯度是在反向中逐渐长出来的），所以峰值仍比 `param` 高。
# - `ddp_fp16` 每步发出的字节是 `ddp` 的一半，峰值却没有下降：压缩只省通信，不省显存。

# %%
for kind in ("param", "hook"):
    print(kind, "各步峰值 MiB：", [round(mib(x), 3) for x in res[0][kind]["peaks"]], "峰值时刻：", res[0][kind]["where"])
    publish(f"{kind}_step_peaks", "、".join(f"{mib(x):.3f}" for x in res[0][kind]["peaks"]))

# %% [markdown]
# `hook` 多出的 0.5 MiB 出现在词嵌入的反向（`EmbeddingBackward0`）里，正好是一个词嵌入大小（1024 × 128 × 4 字节）的梯度张量。`tiny` 的词嵌入同时是输出层的权重，它的梯度由两部分相加。已知的是：从第 2 步起，这块存储在每一步**开始时**就在（是上一步相加得到的词嵌入梯度，`zero_grad()` 之后仍被引用），把钩子里的全规约改成同步的就消失（脚本 `scripts/probes/ch08_hook_gradient_lifetime.py`）；是通信层里的什么还拿着它，没有查清（见第 8 章正文的说明框）。结论不变：钩子重叠的峰值仍明显低于 `flat`，在真实 GPU 上请用 `torch.cuda.max_memory_allocated()` 复核。
#
# 把各写法的稳态峰值画出来：

# %%
import matplotlib
import matplotlib.pyplot as plt
from matplotlib import font_manager

_cjk = [f.name for f in font_manager.fontManager.ttflist
        if any(k in f.name for k in ("Noto Sans CJK", "Source Han Sans", "WenQuanYi", "SimHei", "PingFang"))]
if _cjk:
    matplotlib.rcParams["font.sans-serif"] = [_cjk[0]] + matplotlib.rcParams["font.sans-serif"]
    matplotlib.rcParams["axes.unicode_minus"] = False
ZH = bool(_cjk)            # 没有中文字体时只用英文标签，避免方框

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
peaks = [mib(res[0][k]["peak"]) for k in KINDS]
sent = [res[0][k]["comm"]["bytes"] / 1024 for k in KINDS]
colors = ["tab:red" if k == "flat" else "tab:blue" for k in KINDS]
ax1.bar(KINDS, peaks, color=colors)
ax1.set_ylim(min(peaks) - 1, max(peaks) + 0.5)
ax1.set_ylabel("稳态峰值 (MiB)" if ZH else "steady peak (MiB)")
ax1.set_title("每个 rank 的峰值（模拟设备）" if ZH else "peak per rank (simulated device)")
ax2.bar(KINDS, sent, color=colors)
ax2.set_ylabel("每步全规约字节 (KiB)" if ZH else "all-reduce bytes per step (KiB)")
ax2.set_title("每个 rank 每步交给全规约的数据" if ZH else "data handed to all-reduce per step")
for ax in (ax1, ax2):
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 左图：压缩（`ddp_fp16`）不降低峰值；去掉那份扁平拷贝（`param`、`bucket`）才降低峰值。右图：字节数只由“发什么”决定，与怎么分桶无关（不压缩的六种写法每步都交出 $4\Psi$ 字节）。显存和通信是两本账。
#
# ## 4. 梯度累积：`no_sync()` 把 4 次全规约变成 1 次
#
# 累积 4 个微批次再更新一次。朴素写法每个微批次的 `backward()` 都会触发 DDP 的全规约；把前 3 个放进 `with ddp.no_sync():`，梯度只在本地累加，最后一个微批次才全规约一次。两种写法更新后的参数应当相同（只差浮点求和顺序）。

# %%
def accumulate(kind, rank, world, micro=4):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    ddp = DDP(build_model(MODEL))
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)
    COMM.update(bytes=0, calls=0)
    for i in range(micro):
        ids = torch.randint(0, 1000, (B, T), generator=gen)
        if kind == "no_sync" and i < micro - 1:
            with ddp.no_sync():                        # 只在本地累加，不通信
                (ddp(input_ids=ids, labels=ids).loss / micro).backward()
        else:
            (ddp(input_ids=ids, labels=ids).loss / micro).backward()
    opt.step()
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in ddp.parameters()])
    return dict(comm=dict(COMM), params=flat)


acc = launch(["every_step", "no_sync"], accumulate)
for kind in ("every_step", "no_sync"):
    c = acc[0][kind]["comm"]
    print(pad(kind, 12), f"全规约 {c['calls']} 次，共 {c['bytes'] / 1024:.1f} KiB")
    publish(f"accum_{kind}_calls", c["calls"])
    publish(f"accum_{kind}_kib", c["bytes"] / 1024, fmt="{:.1f}")
diff = float((acc[0]["every_step"]["params"] - acc[0]["no_sync"]["params"]).abs().max())
same_ranks = torch.equal(acc[0]["no_sync"]["params"], acc[1]["no_sync"]["params"])
print(f"两种写法更新后参数的最大差 {diff:.2e}；no_sync 下两个 rank 的参数完全一致：{same_ranks}")
publish("accum_param_diff", diff, fmt="{:.2e}")

# %% [markdown]
# 交给全规约的字节正好降到四分之一（次数不是正好 4 倍，因为 DDP 第一次迭代的分桶与之后不同），参数只差浮点舍入。`no_sync()` 不改变显存：梯度本来就在 `.grad` 里累加，本地累加并不需要额外的缓冲区。
#
# 最后打印多进程部分的用时，只说明教程能在几十秒内跑完，数值取决于机器负载：

# %%
print(f"第 3 部分多进程实验用时 {T_MP:.0f} 秒；整个教程用时 {time.perf_counter() - T_START:.0f} 秒")
