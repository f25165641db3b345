# %% [markdown]
# # 第 20 章 动手教程：梯度通信要多占多少显存
#
# 这份教程配合[第 20 章 分布式训练显存](ch20.md)，分四部分：
#
# 1. **纸面账**：用厂商标称带宽算 Ring AllReduce 的理论下限时间，用 NCCL 源码里的常量算它自己的缓冲区有多大（都是算术，不依赖本机）。
# 2. **两个 gloo 进程、五种写法**：在 CPU 上用 `torch.multiprocessing` 启动 2 个进程，用 gloo 后端组成进程组，训练同一个 `tiny` GPT-2，比较梯度通信的写法：(a) 把全部梯度拼成一个扁平缓冲区；(b) 手写分桶，桶的上限取 512 KiB、1 MiB、2 MiB；(c) 反向结束后逐参数原地 AllReduce；(d) 在 `register_post_accumulate_grad_hook` 钩子里 AllReduce、用这个参数自己的 AdamW 更新、立刻释放梯度（本章练习 `ch20-overlap` 的思路）；另加 (e) 只在钩子里发起异步 AllReduce、反向结束后再统一更新（只重叠、不释放）。每个 rank 里套一个 `vramlab.SimDevice` 量显存，打印一张表。
# 3. **显存时间线**：把 (c) 和 (d) 稳态一步的已分配显存画出来。
# 4. **放大到 GPT-2 small**：单进程、不通信，只比较“反向后统一更新”和“在钩子里逐参数更新并释放梯度”。这一部分用 `vramlab.open_device("auto")`：有 NVIDIA GPU 时在真卡上测，否则在模拟设备上用 FakeTensorMode（只有形状、没有数据）测。
#
# gloo 只能在 CPU 上跑，所以第 2、3 部分即使在 GPU 机器上也在模拟设备上统计。模拟设备关掉了 cuBLAS 工作区（`SimDevice(cublas_workspace=False)`，文档里的选项）：`tiny` 的模型状态只有几 MiB，固定的 64 MiB 工作区会把差别淹没。

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
from vramlab.estimate import param_count
from vramlab.models import build_model, count_params
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()
ON_GPU = banner()
T_START = time.perf_counter()
publish("date", datetime.date.today().isoformat())
publish("torch", torch.__version__)

# %% [markdown]
# ## 1. 纸面账：链路带宽与 NCCL 自己的缓冲区
#
# Ring AllReduce 让每个 rank 发送（也接收）$\frac{2(N-1)}{N}S$ 字节（$S$ 是梯度的字节数，见第 8 章）。如果链路每个方向的带宽是 $B$，一次全规约至少要
#
# $$T_{\min} = \frac{2(N-1)}{N} \cdot \frac{S}{B}.$$
#
# 厂商的标称值常常是“双向合计”，而且网卡用的是比特：NVLink 4（H100/H200）每卡合计 900 GB/s，即每个方向 450 GB/s；NVLink 5（Blackwell）合计 1.8 TB/s，每个方向 900 GB/s；PCIe 5.0 x16 合计 128 GB/s，每个方向 64 GB/s；InfiniBand NDR 每端口 400 Gb/s = 50 GB/s，XDR 800 Gb/s = 100 GB/s（每个方向；出处见正文脚注）。下面用这些数字算两个例子的理论下限：GPT-2 small 的 FP32 梯度，以及 Llama-7B 形状的 BF16 梯度，都是 8 张卡。这只是带宽下限，不含延迟、协议开销和拥塞，不是实测时间。

# %% tags=["links"]
LINKS = [("NVLink 4（H100/H200）", 450e9), ("NVLink 5（Blackwell）", 900e9), ("PCIe 5.0 x16", 64e9),
         ("InfiniBand NDR 400 Gb/s", 50e9), ("InfiniBand XDR 800 Gb/s", 100e9)]
N = 8
cases = [("gpt2-small", 4), ("llama-7b", 2)]
print(pad("链路（每个方向）", 26), pad("GB/s", 6), *[pad(f"{m}（{b} 字节/参数）", 26) for m, b in cases])
sizes = {m: param_count(m) * b for m, b in cases}
for name, bw in LINKS:
    row = [pad(f"{2 * (N - 1) / N * sizes[m] / bw * 1e3:.1f} ms", 26) for m, _ in cases]
    print(pad(name, 26), pad(f"{bw / 1e9:.0f}", 6), *row)
for m, b in cases:
    print(f"{m}：{param_count(m):,} 个参数，梯度 S = {sizes[m] / 1e9:.3f} GB；N = {N} 时每个 rank 发送 "
          f"{2 * (N - 1) / N * sizes[m] / 1e9:.3f} GB")
publish("llama_grad_gb", sizes["llama-7b"] / 1e9, fmt="{:.3f}")
publish("llama_send_gb", 2 * (N - 1) / N * sizes["llama-7b"] / 1e9, fmt="{:.3f}")
publish("llama_params", f"{param_count('llama-7b'):,}")
publish("llama_ndr_s", 2 * (N - 1) / N * sizes["llama-7b"] / 50e9, fmt="{:.2f}")
publish("llama_nvlink4_ms", 2 * (N - 1) / N * sizes["llama-7b"] / 450e9 * 1e3, fmt="{:.0f}")

# %% [markdown]
# 节点内的 NVLink 与节点间的一块 400 Gb/s 网卡差了 9 倍（450 对 50 GB/s）。这就是为什么跨节点的数据并行最依赖通信与计算重叠，也是第 10 章的混合分片把参数的全收集关在节点内的原因。
#
# 再算 NCCL 自己的缓冲区。NCCL 给每条连接（一个通道、一个对端、一个方向）按三种协议各准备一块缓冲区，默认大小由源码 `src/init.cc` 与 `src/include/device.h` 里的常量决定：Simple 协议是 `DEFAULT_BUFFSIZE = 1 << 22`（4 MiB，即 `NCCL_BUFFSIZE` 的默认值），LL 协议是 `NCCL_LL_LINES_PER_THREAD × NCCL_LL_MAX_NTHREADS × NCCL_STEPS × 16 字节`，LL128 协议是 `NCCL_LL128_ELEMS_PER_THREAD × NCCL_LL128_MAX_NTHREADS × NCCL_STEPS × 8 字节`。

# %%
MiB = 2**20
simple = 1 << 22
ll = 8 * 512 * 8 * 16            # LINES_PER_THREAD × LL_MAX_NTHREADS × NCCL_STEPS × sizeof(ncclLLFifoLine)
ll128 = 120 * 640 * 8 * 8        # LL128_ELEMS_PER_THREAD × LL128_MAX_NTHREADS × NCCL_STEPS × sizeof(uint64_t)
per_conn = simple + ll + ll128
print(f"每条连接：Simple {mib(simple):.3f} + LL {mib(ll):.3f} + LL128 {mib(ll128):.3f} = {mib(per_conn):.3f} MiB")
print(pad("通道数", 8), pad("对端数", 8), "缓冲区合计（量级）")
for ch, peers in ((2, 2), (8, 2), (16, 2), (32, 2), (16, 8)):
    print(pad(str(ch), 8), pad(str(peers), 8), f"{mib(ch * peers * per_conn):,.0f} MiB")
    publish(f"nccl_c{ch}_p{peers}_mib", mib(ch * peers * per_conn), fmt="{:,.0f}")
publish("nccl_per_conn_mib", mib(per_conn), fmt="{:.3f}")
publish("nccl_per_conn_short_mib", mib(per_conn), fmt="{:.1f}")

# %% [markdown]
# 这只是量级估算：实际建立多少条连接取决于拓扑、算法（环、树、NVLS）和版本，NCCL 默认也只在第一次用到某条连接时才建立它。要点是：这些缓冲区由 NCCL 自己向 CUDA 申请，**不经过 PyTorch 的缓存分配器**，`torch.cuda.memory_allocated()` 看不到，nvidia-smi 看得到。模拟设备也不模拟它们。
#
# ## 2. 两个 gloo 进程：五种写法的显存
#
# 下面的 `worker` 在每个进程里运行：连上 `127.0.0.1` 的空闲端口，`init_process_group("gloo")`，然后依次用七种配置训练同一个 `tiny` GPT-2（2 层、隐藏维度 128、词表 1024，FP32 + AdamW，每个 rank 批大小 2、序列长度 32）3 步，取第 3 步作为稳态。每个 rank 喂不同的数据；初始权重相同。
#
# | 名称 | 写法 |
# |---|---|
# | `flat` | 反向结束后 `torch.cat` 全部梯度，AllReduce 一次，再拷回各 `.grad` |
# | `bucket_512K` / `bucket_1M` / `bucket_2M` | 按反向顺序（参数倒序）分桶，每桶不超过上限，逐桶拼接、AllReduce、拷回、释放 |
# | `param` | 反向结束后逐参数 `dist.all_reduce(p.grad)` 原地通信，再统一 `optimizer.step()`（练习的起始代码就是这样） |
# | `hook_async` | 钩子里发起 `all_reduce(async_op=True)`，反向结束后等齐、统一 `step()`：只重叠、不释放 |
# | `hook_step` | 钩子里同步 AllReduce（不重叠：反向等它做完才继续）、除以 rank 数、用这个参数自己的 AdamW 更新、`p.grad = None`（练习的思路） |
#
# 每一步分三段量：前向+反向、通信、优化器更新。“通信时多占”是通信这一段的峰值减去它开始时的已分配显存；钩子写法的通信发生在反向里，这一列不适用。
#
# 有一个测量细节：gloo 的后台线程在通信完成之后才放开它对张量的引用，这一刻和 Python 这边释放张量谁先谁后，每次运行、每个 rank 都可能不同。为了让读数可重复，教程在释放扁平缓冲区和钩子里的梯度时先调用 `untyped_storage().resize_(0)`（FSDP 释放完整参数也用这个办法），立即归还存储。

# %%
MODEL, B, T, STEPS = "tiny", 2, 32, 3
CAPS = {"bucket_512K": 512 * 1024, "bucket_1M": 1024**2, "bucket_2M": 2 * 1024**2}
KINDS = ["flat", "bucket_512K", "bucket_1M", "bucket_2M", "param", "hook_async", "hook_step"]


COMM = {"calls": 0, "max_msg": 0}


def install_counter():
    """把 dist.all_reduce 包一层，数调用次数和最大的一次消息（gloo 照常通信）。"""
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        COMM["calls"] += 1
        COMM["max_msg"] = max(COMM["max_msg"], tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counted


def free_now(t):
    """立即归还 t 的存储，不等 gloo 后台线程放开引用（见上文）。"""
    t.untyped_storage().resize_(0)


def make_buckets(params, cap):
    """按反向的大致顺序（参数倒序）分桶，每桶不超过 cap 字节；单个更大的参数自成一桶。"""
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if cur and size + nbytes > cap:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    return buckets + [cur]


def allreduce_flat(params, world):
    flat = torch.cat([p.grad.reshape(-1) for p in params])   # 一个桶大小的新缓冲区
    dist.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    free_now(flat)


def adamw_hyper(opt):
    """与 opt 相同的超参数。torch 2.13 的 AdamW.defaults 里有 decoupled_weight_decay，
    AdamW(**opt.defaults) 会报 TypeError，所以只取这四个。"""
    return {k: opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}


def train(kind, rank, world):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        model = build_model(MODEL)                  # 同一个种子：每个 rank 初始权重相同
        params = list(model.parameters())           # 词嵌入与输出层共享权重，只列一次
        opt = torch.optim.AdamW(params, lr=1e-3)
        works, pending_at_launch = [], []
        if kind.startswith("hook"):
            per_param = {p: torch.optim.AdamW([p], **adamw_hyper(opt)) for p in params}   # 只建一次

            def on_grad(p):                          # 这个参数的梯度刚累加完毕
                pending_at_launch.append(len(params) - len(pending_at_launch) - 1)   # 还没就绪的梯度个数
                if kind == "hook_async":
                    works.append(dist.all_reduce(p.grad, async_op=True))   # 发出去就返回，反向继续
                else:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
                    per_param[p].step()
                    free_now(p.grad)
                    p.grad = None                    # 用完就释放
            for p in params:
                p.register_post_accumulate_grad_hook(on_grad)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for step in range(STEPS):
            ids = torch.randint(0, 1000, (B, T), generator=gen)
            gc.collect()
            COMM.update(calls=0, max_msg=0)
            pending_at_launch.clear()
            dev.reset_peak()
            t0 = len(dev.tracker.timeline)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            p_bw = dev.max_allocated()
            grads_alive = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
            base = dev.allocated()
            dev.reset_peak()
            if kind == "flat":
                allreduce_flat(params, world)
            elif kind in CAPS:
                for bucket in make_buckets(params, CAPS[kind]):
                    allreduce_flat(bucket, world)
            elif kind == "param":
                for p in params:
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            elif kind == "hook_async":
                for w in works:
                    w.wait()
                works.clear()
                for p in params:
                    p.grad.div_(world)
            p_comm = dev.max_allocated()
            dev.reset_peak()
            if kind != "hook_step":                  # hook_step 在反向里已经更新完了
                opt.step()
                opt.zero_grad(set_to_none=True)
            p_opt = dev.max_allocated()
            losses.append(round(loss.item(), 5))
        timeline = [a for a, _, _ in dev.tracker.timeline[t0:]]
        with torch.no_grad():
            wsum = float(sum(p.double().sum() for p in params))
        out = dict(peak=max(p_bw, p_comm, p_opt), p_bw=p_bw, p_opt=p_opt, comm_extra=p_comm - base,
                   grads_alive=grads_alive, calls=COMM["calls"], max_msg=COMM["max_msg"], losses=losses,
                   wsum=wsum, pending=list(pending_at_launch), timeline=timeline,
                   buckets=[sum(p.numel() * p.element_size() for p in b) for b in make_buckets(params, CAPS[kind])]
                   if kind in CAPS else [])
        del model, opt, params
    return out


def worker(rank, world, port, kinds, queue):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        install_counter()
        queue.put((rank, {k: train(k, rank, world) for k in kinds}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(kinds, world=2):
    """一组进程依次跑完所有写法；每种写法都新建模型、优化器和钩子。某个 rank 崩溃时 10 分钟后报错。"""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    pc = mp.start_processes(worker, args=(world, free_port(), kinds, queue),
                            nprocs=world, start_method="fork", join=False)
    results = dict(queue.get(timeout=600) for _ in range(world))
    pc.join()
    return results


t0 = time.perf_counter()
res = launch(KINDS)
T_MP = time.perf_counter() - t0
print(f"2 个 rank 都已返回（{len(KINDS)} 种配置）。")

# %% [markdown]
# 先确认七种配置训练的是同一件事：每个 rank 各步的损失、3 步之后全部参数之和。

# %%
psi = count_params(MODEL)
print(f"{MODEL}：Ψ = {psi:,} 个参数；FP32 梯度 4Ψ = {mib(4 * psi):.3f} MiB\n")
for kind in KINDS:
    r0, r1 = res[0][kind], res[1][kind]
    print(pad(kind, 13), f"rank 0 损失 {r0['losses']}", f" 参数之和 rank0 {r0['wsum']:.6f} rank1 {r1['wsum']:.6f}")
print("\n七种配置、两个 rank 的参数完全一致：", len({res[r][k]["wsum"] for r in (0, 1) for k in KINDS}) == 1)

# %% [markdown]
# 通信写法只改变“什么时候、分几次”全规约和更新；AdamW 对每个元素的更新只依赖这个元素自己的梯度和状态，所以“每个参数一个 AdamW”与“一个 AdamW 管全部参数”的结果一位不差。
#
# 下面是稳态一步（第 3 步）的读数，取 rank 0（两个 rank 的峰值见最后两列）。单位 MiB，模拟设备的已分配显存：

# %% tags=["dp_table"]
ref = res[0]["param"]["peak"]
print(pad("写法", 13), pad("全规约", 7), pad("最大消息", 9), pad("最大桶", 8), pad("反向后仍在", 11),
      pad("通信时多占", 11), pad("整步峰值", 9), pad("相对 param", 11), pad("rank0", 8), pad("rank1", 8))
print(pad("", 13), pad("次数", 7), pad("KiB", 9), pad("KiB", 8), pad("的梯度", 11), pad("", 11))
for kind in KINDS:
    r0, r1 = res[0][kind], res[1][kind]
    extra = "—" if kind.startswith("hook") else f"{mib(r0['comm_extra']):.3f}"
    biggest = f"{max(r0['buckets']) / 1024:.0f}" if r0["buckets"] else "—"
    print(pad(kind, 13), pad(str(r0["calls"]), 7), pad(f"{r0['max_msg'] / 1024:.0f}", 9), pad(biggest, 8),
          pad(f"{mib(r0['grads_alive']):.3f}", 11), pad(extra, 11), pad(f"{mib(r0['peak']):.3f}", 9),
          pad(f"{r0['peak'] / ref:.3f}", 11), pad(f"{mib(r0['peak']):.3f}", 8), pad(f"{mib(r1['peak']):.3f}", 8))
    publish(f"dp_{kind.lower()}_calls", r0["calls"])
    publish(f"dp_{kind.lower()}_peak_mib", mib(r0["peak"]), fmt="{:.3f}")
    if not kind.startswith("hook"):
        publish(f"dp_{kind.lower()}_comm_extra_mib", mib(r0["comm_extra"]), fmt="{:.3f}")
    if r0["buckets"]:
        publish(f"dp_{kind.lower()}_max_bucket_kib", max(r0["buckets"]) / 1024, fmt="{:.0f}")
publish("dp_grad_mib", mib(4 * psi), fmt="{:.3f}")
publish("dp_hook_async_over_param_mib", mib(res[0]["hook_async"]["peak"] - res[0]["param"]["peak"]), fmt="{:.1f}")
publish("dp_ranks_same", "相同" if all(res[0][k]["peak"] == res[1][k]["peak"] for k in KINDS) else "不完全相同")

# %% [markdown]
# 读法：
#
# - **扁平缓冲区与分桶**：“通信时多占”正好是最大的那个桶（`flat` 就是整份梯度 $4\Psi$）。桶越大，这一段的峰值越高；桶小到一定程度，通信这一段就不再是一步里最满的时刻，整步峰值回到反向过程中的最高点。全规约次数则反过来：桶越小，次数越多。`bucket_512K` 的最大消息是 512 KiB，因为最大的单个参数（词嵌入，1024 × 128 × 4 字节）自成一桶。
# - **`param`**：原地通信，通信这一段一个字节也不多占；但反向结束时整份梯度都还在（“反向后仍在的梯度”一列），要等 `step()` 之后才释放。
# - **`hook_async`**：通信挪进了反向，和计算重叠，但梯度一个也没少，峰值不降反升（第 8 章教程解释过这 0.5 MiB：词嵌入的梯度在钩子触发时多留了一份）。**重叠本身不省显存。**
# - **`hook_step`**：每个梯度算好就通信、更新、释放，反向结束时一个梯度也不剩，优化器那一段也没有了，峰值是七种配置里最低的。它的 AllReduce 是同步的，反向要等每次通信做完才继续，所以它**不**重叠：省显存的代价是时间。
#
# - 两个钩子写法正好是一对：`hook_async` 重叠、不省显存；`hook_step` 省显存、不重叠。
#
# 再看 `hook_async` 的重叠有多早开始：它每次发起 AllReduce 时，还有多少个参数的梯度没算出来（rank 0，稳态一步）。

# %%
pend = res[0]["hook_async"]["pending"]
print(f"参数共 {len(pend)} 个；第 1 次发起 AllReduce 时还有 {pend[0]} 个参数的梯度没算出来，"
      f"第 {len(pend) // 2} 次时还有 {pend[len(pend) // 2 - 1]} 个，最后一次时还有 {pend[-1]} 个。")

# %% [markdown]
# 第一个 AllReduce 发起时，反向还有绝大部分参数的梯度没算：后面这些梯度的计算都可以和它的通信同时进行。在 GPU 上，NCCL 的通信在单独的 CUDA 流上执行，这种重叠才真正省下时间；gloo 在 CPU 上由后台线程执行。
#
# ## 3. 显存时间线：`param` 与 `hook_step`
#
# 把稳态一步的已分配显存按分配/释放事件的顺序画出来（横轴是事件序号，不是时间）。

# %%
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免方框

fig, ax = plt.subplots(figsize=(9, 3.8))
for kind, color in (("param", "tab:blue"), ("hook_step", "tab:green"), ("flat", "tab:red")):
    tl = res[0][kind]["timeline"]
    ax.plot(range(len(tl)), [mib(a) for a in tl], color=color, lw=1.2, label=kind)
ax.set_xlabel("分配/释放事件序号" if ZH else "allocation event index")
ax.set_ylabel("已分配显存 (MiB)" if ZH else "allocated (MiB)")
ax.set_title("tiny，2 个 gloo 进程，rank 0 的稳态一步（模拟设备）" if ZH
             else "tiny, 2 gloo ranks, rank 0, steady step (simulated device)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# 三条线在前向阶段重合（`param` 的蓝线大部分被 `flat` 的红线盖住）。反向阶段 `param` 和 `flat` 的梯度一个个长出来、一直留到最后；`flat` 在反向之后冒出一个整份梯度大小的尖峰；随后是两者的优化器更新，结束时梯度才一起释放。`hook_step` 的梯度长出来就被释放，反向后半段明显更低；它没有单独的优化器阶段，更新分散在各个钩子里，末尾的几个小尖峰出现在最后几个钩子（其中有词嵌入的更新）里。
#
# ## 4. 放大到 GPT-2 small：在钩子里更新并释放梯度
#
# 第 2 部分的模型太小，差别只有零点几 MiB。下面不通信、单进程，用 GPT-2 small（1.24 亿参数，FP32 + AdamW）在两种批次设置下比较两种写法的稳态峰值（第 1 步热身、AdamW 在那时创建状态，第 2 步是稳态）：
#
# - `after`：普通的一步，反向结束后 `optimizer.step()`；
# - `in_backward`：PyTorch 官方教程“把优化器 step 融合进反向”的写法，每个参数一个 AdamW，在 `register_post_accumulate_grad_hook` 里 step 并释放梯度。数据并行时，把本章练习的 AllReduce 加在 step 之前即可。
#
# 有 GPU 时用真卡；否则在模拟设备上用 FakeTensorMode。这一部分保留了模拟设备默认的 cuBLAS 工作区（前向、反向各 32 MiB，峰值组成里的 `cuda_overhead`），两种写法都有，不影响差值。

# %%
FAKE = not ON_GPU
BIG = "gpt2-small"
SETTINGS = [(2, 256), (1, 64)]          # (批大小, 序列长度)


def one_run(mode, BB, BT):
    with vramlab.open_device("auto", fake=FAKE) as dev:
        model = build_model(BIG, device=dev.torch_device, seed=0)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if mode == "in_backward":
            per_param = {p: torch.optim.AdamW([p], **adamw_hyper(opt)) for p in model.parameters()}

            def hook(p):
                per_param[p].step()
                p.grad = None
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)
        peaks = []
        for step in range(2):                       # 第 1 步热身，第 2 步是稳态
            ids = torch.randint(0, 50257, (BB, BT), device=dev.torch_device)
            dev.reset_peak()
            model(input_ids=ids, labels=ids).loss.backward()
            if mode == "after":
                opt.step()
                opt.zero_grad(set_to_none=True)
            peaks.append(dev.max_allocated())
        snap = dev.snapshot()
        return dict(peaks=peaks, where=snap["peak_where"], bd=snap["breakdown"])


psi_big = count_params(BIG)
print(f"{BIG}：Ψ = {psi_big:,}；FP32 梯度 4Ψ = {mib(4 * psi_big):.1f} MiB；"
      f"{'CUDA' if ON_GPU else '模拟设备（FakeTensorMode）'}")
for BB, BT in SETTINGS:
    big = {m: one_run(m, BB, BT) for m in ("after", "in_backward")}
    print(f"\n批大小 {BB}，序列长度 {BT}：")
    print(pad("  写法", 14), pad("各步峰值 MiB", 30), "峰值位置")
    for m, r in big.items():
        print(pad("  " + m, 14), pad(" / ".join(f"{mib(x):.1f}" for x in r["peaks"]), 30), r["where"])
    saved = big["after"]["peaks"][-1] - big["in_backward"]["peaks"][-1]
    print(f"  稳态峰值少了 {mib(saved):.1f} MiB（{saved / big['after']['peaks'][-1]:.1%}），是 4Ψ 的 {saved / (4 * psi_big):.2f} 倍")
    publish(f"big_b{BB}_s{BT}_saved_mib", mib(saved), fmt="{:.1f}")
    publish(f"big_b{BB}_s{BT}_saved_pct", saved / big["after"]["peaks"][-1], fmt="{:.1%}")
    for m, r in big.items():
        publish(f"big_b{BB}_s{BT}_{m}_grads_mib", mib(r["bd"].get("gradients", 0)), fmt="{:.1f}")
        publish(f"big_b{BB}_s{BT}_{m}_cuda_mib", mib(r["bd"].get("cuda_overhead", 0)), fmt="{:.0f}")
    for m, r in big.items():
        parts = "，".join(f"{k} {mib(v):.1f}" for k, v in r["bd"].items() if v)
        print(f"  {m} 峰值时刻的组成（MiB）：{parts}")
publish("big_grad_mib", mib(4 * psi_big), fmt="{:.1f}")

# %% [markdown]
# 两种设置的结论截然不同，原因在峰值出现的时刻：
#
# - 批大小 2、序列长度 256 时，峰值在反向**刚开始**（`LogSoftmaxBackward0`，logits 的梯度那一刻），这时一个参数梯度都还没有，在钩子里释放梯度自然省不了什么。
# - 批大小 1、序列长度 64 时，激活值很小，峰值挪到了反向**末尾**（`EmbeddingBackward0`），`after` 这时几乎整份梯度都在；`in_backward` 的梯度边算边释放，峰值时刻只剩还没处理完的那部分（主要是与输出层共享权重的词嵌入的梯度，它要等嵌入层的反向做完才累加完毕）。
#
# 所以“在反向里更新并释放梯度”省多少，取决于峰值时刻有多少梯度活着：先看峰值位置和组成，再决定用不用它。
#
# 最后记一下多进程部分的用时（只说明它能跑完，取决于机器负载）：

# %%
print(f"第 2 部分的多进程实验用时 {T_MP:.0f} 秒；整个教程 {time.perf_counter() - T_START:.0f} 秒")
