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
# # 第 9 章 动手教程：模型并行，每个 rank 存了多少
#
# 这份教程配合[第 9 章 模型并行策略](ch09.md)，做四件事：
#
# 1. 在本机 CPU 上用 `torch.multiprocessing` 启动 **2 个 gloo 进程**，手写 Megatron 式张量并行：GPT-2 small 尺寸的 MLP 先按列切、再按行切，前向只做一次全规约（all-reduce），和“每个 rank 一整份”的写法比较每个 rank 的峰值显存；再用 $f$ / $g$ 两个共轭算子跑一遍前向加反向，确认梯度与整份计算一致；注意力按头切分也验证一遍。
# 2. 在同样的 2 个进程里加上序列并行：LayerNorm 和残差沿序列维度切开，看前向结束时每个 rank 为反向保存的激活值少了多少；最后用 PyTorch 的 `parallelize_module` + `ColwiseParallel` / `RowwiseParallel` 写同一个 MLP。
# 3. 流水线并行：在模拟设备上逐段（stage）重放 GPipe 和 1F1B 两种调度，量出每个 stage 的峰值和“同时挂着几个微批次的激活值”，并用一个小的时间模型画出调度图、核对气泡比例公式。
# 4. 解析表：Korthikanti 等人的每层激活值公式（张量并行、序列并行、选择性重算），以及 1D / 2D / 2.5D / 3D 张量并行每个 rank 的参数、激活值和通信量。
#
# 第 1、2 部分的显存在每个进程自己的 `vramlab.SimDevice`（CPU 上的模拟设备）里统计；第 3 部分用 `vramlab.open_device("auto")`，有 NVIDIA GPU 时在真卡上测量，没有时在模拟设备上用 FakeTensorMode（只有形状、没有数据）几秒跑完。

# %%
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import transformers

import vramlab
from vramlab.display import banner, pad, mib, free_port
from vramlab.models import make_config
from vramlab.tutorials import publish      # 把结果交给正文：章节页面上的数字就是这里发布的值

transformers.logging.set_verbosity_error()
ON_GPU = banner()
publish("date", time.strftime("%Y-%m-%d"))
publish("torch", torch.__version__)


def tex(x, digits=2):
    """正文公式里的写法：够大的数照常写（digits 位有效数字），很小的写成 a × 10^n。"""
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.{digits}g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa} \\times 10^{{{int(exponent)}}}"
print("gloo 可用    ", dist.is_gloo_available())

# %% [markdown]
# ## 1. 张量并行：一个 MLP 切成两半
#
# GPT-2 的 MLP 是 $Y = \mathrm{GeLU}(XA)B$：$X$ 是 $[b, s, h]$ 的输入，$A$ 把 $h$ 维升到 $4h$，$B$ 再降回 $h$。Megatron-LM 的切法是：
#
# - $A$ **按列切**（column parallel，按输出特征切）：rank $i$ 拿 $A_i$，算 $Y_i = \mathrm{GeLU}(XA_i)$。GeLU 是逐元素的，所以每个 rank 各算各的，不需要通信。
# - $B$ **按行切**（row parallel，按输入特征切）：rank $i$ 拿 $B_i$，算部分和 $Y_iB_i$；最后一次全规约得到 $\sum_i Y_iB_i = YB$。
#
# 用 `nn.Linear` 的存储方式（`weight` 是 $[\text{out}, \text{in}]$），按列切 $A$ 就是取 `fc_weight` 的若干**行**（输出特征），按行切 $B$ 就是取 `proj_weight` 的若干**列**（输入特征）。偏置也要跟着切：`fc_bias` 随输出特征切开；`proj_bias` 不切，但只能在全规约**之后**加一次，否则会被加 $t$ 次。
#
# 下面的 `worker` 在每个进程里运行：连上 `127.0.0.1` 的一个空闲端口，`init_process_group("gloo")`。完整的 FP32 权重放在主存（`dev.host()` 里创建，不算显存），两个 rank 用同一个随机种子，所以权重和输入 $x$ 都一模一样（$x$ 已经在设备上，每个 rank 一份）。尺寸取 GPT-2 small：$h = 768$、12 个头，批大小 2、序列长度 512。

# %%
H, HEADS, B, T = 768, 12, 2, 512
WORLD = 2


def host_weights(dev, seed=0):
    """完整的 FP32 权重，放在主存里（nn.Linear 的布局：weight 是 [out, in]）。"""
    g = torch.Generator().manual_seed(seed)
    with dev.host():
        w = dict(
            fc_weight=torch.randn(4 * H, H, generator=g) * 0.02, fc_bias=torch.randn(4 * H, generator=g) * 0.02,
            proj_weight=torch.randn(H, 4 * H, generator=g) * 0.02, proj_bias=torch.randn(H, generator=g) * 0.02,
            ln_weight=1 + 0.1 * torch.randn(H, generator=g), ln_bias=0.1 * torch.randn(H, generator=g),
            qkv_weight=torch.randn(3 * H, H, generator=g) * 0.02, qkv_bias=torch.randn(3 * H, generator=g) * 0.02,
            out_weight=torch.randn(H, H, generator=g) * 0.02, out_bias=torch.randn(H, generator=g) * 0.02)
    return w


def full_mlp(x, w, dev):
    """“每个 rank 一整份”：把全部权重拷到设备上，每个 rank 重复计算整个 MLP。"""
    fc_w, fc_b = dev.to_device(w["fc_weight"]), dev.to_device(w["fc_bias"])
    pj_w, pj_b = dev.to_device(w["proj_weight"]), dev.to_device(w["proj_bias"])
    h = F.gelu(F.linear(x, fc_w, fc_b), approximate="tanh")
    return F.linear(h, pj_w, pj_b)


def tp_mlp(x, w, dev):
    """Megatron 式张量并行：fc 按输出特征（列）切，proj 按输入特征（行）切，一次全规约。"""
    rank, t = dist.get_rank(), dist.get_world_size()
    cols = slice(rank * 4 * H // t, (rank + 1) * 4 * H // t)   # 本 rank 负责的那 4h/t 个隐藏单元
    fc_w = dev.to_device(w["fc_weight"][cols])                 # [4h/t, h]：只拷本 rank 的一片
    fc_b = dev.to_device(w["fc_bias"][cols])
    pj_w = dev.to_device(w["proj_weight"][:, cols])            # [h, 4h/t]
    h = F.gelu(F.linear(x, fc_w, fc_b), approximate="tanh")    # [b, s, 4h/t]，不需要通信
    y = F.linear(h, pj_w)                                      # 部分和 Y_i B_i
    dist.all_reduce(y)                                         # 各 rank 的部分和相加：g 算子
    return y + dev.to_device(w["proj_bias"])                   # 偏置只加一次


# %% [markdown]
# 反向时情况反过来。Megatron-LM 论文把这两种通信写成一对共轭算子（conjugate operators）：
#
# - $f$ 放在列切分的线性层之前：前向是恒等（每个 rank 拿同一个 $X$），反向是全规约（$\partial L/\partial X = \sum_i \partial L/\partial X$ 在 rank $i$ 上的那一份）；
# - $g$ 放在行切分的线性层之后：前向是全规约，反向是恒等。
#
# 用 `torch.autograd.Function` 写出来只有几行。下面的 `tp_mlp_train` 用它们做前向加反向，`full_mlp_train` 是对照。

# %%
class CopyToTP(torch.autograd.Function):
    """f：前向恒等，反向全规约。"""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    """g：前向全规约（就地），反向恒等。"""
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def device_params(w, dev, rank=None, t=1):
    """把 MLP 的权重（t > 1 时只拷本 rank 那一片）拷到设备上，作为需要梯度的参数。"""
    cols = slice(None) if t == 1 else slice(rank * 4 * H // t, (rank + 1) * 4 * H // t)
    p = dict(fc_w=w["fc_weight"][cols], fc_b=w["fc_bias"][cols], pj_w=w["proj_weight"][:, cols],
             pj_b=w["proj_bias"], ln_w=w["ln_weight"], ln_b=w["ln_bias"])
    return {k: dev.to_device(v).requires_grad_() for k, v in p.items()}


def full_mlp_train(x, p):
    h = F.gelu(F.linear(x, p["fc_w"], p["fc_b"]), approximate="tanh")
    return F.linear(h, p["pj_w"], p["pj_b"])


def tp_mlp_train(x, p):
    x = CopyToTP.apply(x)                                      # f
    h = F.gelu(F.linear(x, p["fc_w"], p["fc_b"]), approximate="tanh")
    y = ReduceFromTP.apply(F.linear(h, p["pj_w"]))             # g
    out = y + p["pj_b"]
    # 全规约过的 y 到这里就没用了。gloo 的后台线程放开它对 y 的引用的时机每次都不同（见第 20 章教程），
    # 先把存储还回去，前向后“多出多少”的读数才可重复
    y.untyped_storage().resize_(0)
    return out


# %% [markdown]
# 注意力也一样切：每个头的计算互不相干，所以把 12 个头平均分给两个 rank。$Q$、$K$、$V$ 的投影按列切（每个 rank 只算自己那 6 个头的 $Q$、$K$、$V$），输出投影按行切，最后一次全规约。GPT-2 把 $Q$、$K$、$V$ 拼在一个 $[3h, h]$ 的权重里（这里用 `nn.Linear` 的布局），所以要分别从三段里取本 rank 那几个头的行。

# %%
def attention(x, qkv_w, qkv_b, out_w, n_heads):
    b, s, _ = x.shape
    q, k, v = F.linear(x, qkv_w, qkv_b).chunk(3, dim=-1)
    q, k, v = (z.view(b, s, n_heads, -1).transpose(1, 2) for z in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(1, 2).reshape(b, s, -1), out_w)


def tp_attention(x, w, dev):
    rank, t = dist.get_rank(), dist.get_world_size()
    d = H // t                                                  # 本 rank 的 HEADS/t 个头共 d 维
    rows = torch.cat([torch.arange(j * H + rank * d, j * H + (rank + 1) * d) for j in range(3)])  # q、k、v 各取一段
    qkv_w = dev.to_device(w["qkv_weight"][rows])                # [3h/t, h]
    qkv_b = dev.to_device(w["qkv_bias"][rows])
    out_w = dev.to_device(w["out_weight"][:, rank * d:(rank + 1) * d])   # [h, h/t]：按行切
    y = attention(x, qkv_w, qkv_b, out_w, HEADS // t)
    dist.all_reduce(y)
    return y + dev.to_device(w["out_bias"])


# %% [markdown]
# ## 2. 序列并行：LayerNorm 和残差沿序列切开
#
# 张量并行只切了矩阵乘法；夹在中间的 LayerNorm、dropout、残差相加在每个 rank 上都是整份的 $[s, b, h]$。Korthikanti 等人的序列并行（sequence parallelism）把这些逐 token 的操作沿序列维度切成 $t$ 份：进入列切分的线性层之前做一次全收集（all-gather，记作 $g$），离开行切分的线性层时把原来的全规约换成规约-散射（reduce-scatter，记作 $\bar g$）。一次全规约本来就等于一次规约-散射加一次全收集，所以通信量不变。
#
# 按 Megatron 的习惯，这里的张量用序列在前的 $[s, b, h]$ 布局（`all_gather_single` / `reduce_scatter_single` 沿第 0 维拼接、切分）。论文里还有一个细节：全收集出来的完整输入要给第一个线性层的反向用（算权重梯度），如果直接保存，序列并行就白切了；Megatron 只保存本 rank 那一片，反向时再全收集一次。下面的 `GatherLinear` 就是这样做的。

# %%
def _gather(x):
    out = x.new_empty((x.shape[0] * dist.get_world_size(),) + tuple(x.shape[1:]))
    dist.all_gather_single(out, x.contiguous())
    return out


def _reduce_scatter(x):
    out = x.new_empty((x.shape[0] // dist.get_world_size(),) + tuple(x.shape[1:]))
    dist.reduce_scatter_single(out, x.contiguous())
    return out


class GatherLinear(torch.autograd.Function):
    """g + 列切分线性层：前向全收集序列分片再乘 W；只保存分片，反向时再全收集一次。"""
    @staticmethod
    def forward(ctx, x_shard, weight, bias):
        ctx.save_for_backward(x_shard, weight)
        return F.linear(_gather(x_shard), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_shard, weight = ctx.saved_tensors
        full = _gather(x_shard)                                     # 反向里再收集一次
        grad_w = grad.flatten(0, 1).t() @ full.flatten(0, 1)
        grad_x = _reduce_scatter(grad @ weight)                     # 输入梯度：规约-散射回序列分片
        return grad_x, grad_w, grad.sum((0, 1))


class ReduceScatterSeq(torch.autograd.Function):
    """ḡ：前向规约-散射（沿序列），反向全收集。"""
    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad)


def block_full(x, p):            # LayerNorm + MLP + 残差，每个 rank 一整份
    return x + full_mlp_train(F.layer_norm(x, (H,), p["ln_w"], p["ln_b"]), p)


def block_tp(x, p):              # 张量并行：LayerNorm、残差仍是整份 [s, b, h]
    return x + tp_mlp_train(F.layer_norm(x, (H,), p["ln_w"], p["ln_b"]), p)


def block_tp_sp(x_shard, p):     # 张量并行 + 序列并行：x_shard 是 [s/t, b, h]
    ln = F.layer_norm(x_shard, (H,), p["ln_w"], p["ln_b"])
    h = F.gelu(GatherLinear.apply(ln, p["fc_w"], p["fc_b"]), approximate="tanh")
    y = ReduceScatterSeq.apply(F.linear(h, p["pj_w"]))
    return x_shard + y + p["pj_b"]


# %% [markdown]
# 每个进程依次跑下面几项，每项都在一个新的 `SimDevice` 里，峰值从 $x$ 已经在设备上时开始算：
#
# | 名称 | 内容 |
# |---|---|
# | `mlp_full` / `mlp_tp` | 只做前向（推理）：整份权重 vs. 张量并行 |
# | `train_full` / `train_tp` | 前向 + 反向（$f$ / $g$ 算子），比较梯度 |
# | `attn` | 注意力按头切分，只核对数值 |
# | `blk_full` / `blk_tp` / `blk_sp` | LayerNorm + MLP + 残差：前向结束时为反向保存了多少字节，再反向核对梯度 |
# | `dtensor` | `parallelize_module` + `ColwiseParallel` / `RowwiseParallel`，只核对数值 |

# %%
def run_forward(rank, fn):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        w = host_weights(dev)
        x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(1))   # 已在设备上，每个 rank 相同
        dev.reset_peak()
        base = dev.allocated()
        y = fn(x, w, dev)
        out = dict(peak=dev.max_allocated(), base=base, y=dev.to_host(y))
        del y, x
    return out


def run_train(rank, fn, t):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        w = host_weights(dev)
        p = device_params(w, dev, rank, t)
        x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(1)).requires_grad_()
        gy = torch.randn(B, T, H, generator=torch.Generator().manual_seed(2))   # 假想的上游梯度
        dev.reset_peak()
        y = fn(x, p)
        y.backward(gy)
        out = dict(peak=dev.max_allocated(), weights=sum(v.nbytes for v in p.values()),
                   y=dev.to_host(y), x_grad=dev.to_host(x.grad), fc_w_grad=dev.to_host(p["fc_w"].grad))
        del y, x, p, gy
    return out


def run_block(rank, kind, t):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        w = host_weights(dev)
        p = device_params(w, dev, rank, 1 if kind == "full" else t)
        x = torch.randn(T, B, H, generator=torch.Generator().manual_seed(1))     # [s, b, h]
        gy = torch.randn(T, B, H, generator=torch.Generator().manual_seed(2))
        rows = slice(rank * T // t, (rank + 1) * T // t)
        if kind == "sp":                                                        # 序列并行：每个 rank 只有 s/t 个 token
            x, gy = x[rows].clone(), gy[rows].clone()
        x.requires_grad_()
        before = dev.allocated()
        y = {"full": block_full, "tp": block_tp, "sp": block_tp_sp}[kind](x, p)
        held = dev.allocated() - before                                         # 保存给反向的激活值 + 输出
        y.backward(gy)
        out = dict(held=held, out=y.nbytes, y=dev.to_host(y), x_grad=dev.to_host(x.grad),
                   fc_w_grad=dev.to_host(p["fc_w"].grad), rows=rows)
        del y, x, p, gy
    return out


def run_dtensor(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        w = host_weights(dev)
        mlp = torch.nn.Sequential(torch.nn.Linear(H, 4 * H), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * H, H))
        with torch.no_grad():
            for lin, name in ((mlp[0], "fc"), (mlp[2], "proj")):
                lin.weight.copy_(w[f"{name}_weight"])
                lin.bias.copy_(w[f"{name}_bias"])
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(1))
        y = mlp(x)
        return dict(y=dev.to_host(y), shapes=[tuple(mlp[i].weight.to_local().shape) for i in (0, 2)],
                    placements=[str(mlp[i].weight.placements) for i in (0, 2)])


def convert(obj, fn):
    """递归地把结果里的张量（或 numpy 数组）用 fn 转换。"""
    import numpy as np
    if isinstance(obj, dict):
        return {k: convert(v, fn) for k, v in obj.items()}
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return fn(obj)
    return obj


def worker(rank, port, queue):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        r = {"mlp_full": run_forward(rank, full_mlp), "mlp_tp": run_forward(rank, tp_mlp),
             "train_full": run_train(rank, full_mlp_train, 1), "train_tp": run_train(rank, tp_mlp_train, WORLD)}
        with vramlab.SimDevice(cublas_workspace=False) as dev:    # 注意力：只核对数值
            w = host_weights(dev)
            x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(1))
            ref = attention(x, w["qkv_weight"], w["qkv_bias"], w["out_weight"], HEADS) + w["out_bias"]
            r["attn_err"] = (tp_attention(x, w, dev) - ref).abs().max().item()
        for kind in ("full", "tp", "sp"):
            r[f"blk_{kind}"] = run_block(rank, kind, WORLD)
        r["dtensor"] = run_dtensor(rank)
        queue.put((rank, convert(r, lambda t: t.numpy())))   # 张量转成 numpy 再传回主进程
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch():
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    pc = mp.start_processes(worker, args=(free_port(), queue), nprocs=WORLD, start_method="fork", join=False)
    results = dict(queue.get() for _ in range(WORLD))
    pc.join()
    return {rank: convert(r, torch.from_numpy) for rank, r in results.items()}


t0 = time.perf_counter()
res = launch()
print(f"2 个 rank 都已返回，用时 {time.perf_counter() - t0:.0f} 秒（只作参考，取决于机器负载）")

# %% [markdown]
# ### 1.1 只做前向：每个 rank 的峰值
#
# 先核对结果：张量并行的输出与整份计算的输出应当相同（只差浮点求和顺序带来的舍入）。然后看每个 rank 的已分配峰值（模拟设备的 `max_allocated`，从 $x$ 已在设备上时算起）。

# %% tags=["mlp_forward"]
print(pad("rank", 6), pad("写法", 10), pad("峰值 MiB", 10), pad("其中 x MiB", 11), pad("与整份之比", 10), "与整份输出的最大差")
for rank in range(WORLD):
    full, tp = res[rank]["mlp_full"], res[rank]["mlp_tp"]
    for name, r in (("整份", full), ("张量并行", tp)):
        err = (r["y"] - full["y"]).abs().max().item()
        print(pad(str(rank), 6), pad(name, 10), pad(f"{mib(r['peak']):.2f}", 10), pad(f"{mib(r['base']):.2f}", 11),
              pad(f"{r['peak'] / full['peak']:.3f}", 10), f"{err:.1e}")
P_W = (4 * H * H + 4 * H + 4 * H * H + H) * 4
print(f"\nMLP 的 FP32 权重：整份 {mib(P_W):.2f} MiB；每个 rank 一半 ≈ {mib(P_W) / 2:.2f} MiB（proj_bias 不切）")
print(f"一个 [b, s, h] 的 FP32 张量 = {mib(B * T * H * 4):.2f} MiB，[b, s, 4h] = {mib(B * T * 4 * H * 4):.2f} MiB")
full, tp = res[0]["mlp_full"], res[0]["mlp_tp"]
publish("fwd_full_mib", mib(full["peak"]), fmt="{:.2f}")
publish("fwd_tp_mib", mib(tp["peak"]), fmt="{:.2f}")
publish("fwd_ratio", tp["peak"] / full["peak"], fmt="{:.3f}")
publish("fwd_x_mib", mib(full["base"]), fmt="{:.2f}")
publish("mlp_weights_mib", mib(P_W), fmt="{:.2f}")
publish("bsh_mib", mib(B * T * H * 4), fmt="{:.2f}")
publish("bs4h_mib", mib(B * T * 4 * H * 4), fmt="{:.2f}")

# %% [markdown]
# 整份写法的峰值由三样东西组成：整份权重、输入 $x$、以及前向中同时活着的两个 $[b, s, 4h]$ 张量（`fc` 的输出和 GeLU 的输出）。张量并行把权重和这两个 $[b, s, 4h]$ 都切成一半，但 $x$ 和输出 $y$ 仍是整份的 $[b, s, h]$：每个 rank 都要拿到完整的 $x$，也都得到完整的 $y$。所以比值比 0.5 高一些，高出的正是这些切不动的 $[b, s, h]$ 张量。
#
# ### 1.2 前向 + 反向：$f$ / $g$ 算子给出同样的梯度
#
# 张量并行的输入梯度 $\partial L/\partial x$ 要和整份计算完全一致（这是 $f$ 在反向做全规约的结果）；`fc` 权重的梯度是整份梯度里本 rank 那几行。

# %%
print(pad("rank", 6), pad("写法", 10), pad("设备上的权重 MiB", 17), pad("峰值 MiB", 10), pad("与整份之比", 10))
for rank in range(WORLD):
    full, tp = res[rank]["train_full"], res[rank]["train_tp"]
    for name, r in (("整份", full), ("张量并行", tp)):
        print(pad(str(rank), 6), pad(name, 10), pad(f"{mib(r['weights']):.2f}", 17), pad(f"{mib(r['peak']):.2f}", 10),
              pad(f"{r['peak'] / full['peak']:.3f}", 10))
for rank in range(WORLD):
    full, tp = res[rank]["train_full"], res[rank]["train_tp"]
    cols = slice(rank * 4 * H // WORLD, (rank + 1) * 4 * H // WORLD)
    print(f"rank {rank}：输出最大差 {(tp['y'] - full['y']).abs().max().item():.1e}，"
          f"x 梯度最大差 {(tp['x_grad'] - full['x_grad']).abs().max().item():.1e}，"
          f"fc 权重梯度（本 rank 的行）最大差 {(tp['fc_w_grad'] - full['fc_w_grad'][cols]).abs().max().item():.1e}")
print(f"注意力按头切分：与整份注意力的最大差 rank 0 {res[0]['attn_err']:.1e}，rank 1 {res[1]['attn_err']:.1e}")
full, tp = res[0]["train_full"], res[0]["train_tp"]
publish("train_full_mib", mib(full["peak"]), fmt="{:.2f}")
publish("train_tp_mib", mib(tp["peak"]), fmt="{:.2f}")
publish("train_ratio", tp["peak"] / full["peak"], fmt="{:.3f}")
publish("train_y_err", tex(max((res[r]["train_tp"]["y"] - res[r]["train_full"]["y"]).abs().max().item() for r in range(WORLD))))
publish("train_xgrad_err", tex(max((res[r]["train_tp"]["x_grad"] - res[r]["train_full"]["x_grad"]).abs().max().item() for r in range(WORLD))))
publish("attn_err", tex(max(res[r]["attn_err"] for r in range(WORLD))))

# %% [markdown]
# 这里的“设备上的权重”包括 LayerNorm 的参数（第 2 部分要用，这一项里没参与计算）。去掉 $f$ 会怎样？前向结果不变，但每个 rank 的 $\partial L/\partial x$ 只有自己那一半隐藏单元的贡献，再往前传的梯度就错了，而且不会报错。这是手写张量并行最隐蔽的一个坑。
#
# ### 2.1 序列并行：前向结束时为反向留下了多少
#
# 对 LayerNorm + MLP + 残差这个小块，记下前向结束时比前向开始时多出来的字节：保存给反向的激活值，加上输出本身。

# %%
SBH = T * B * H * 4    # 一个 [s, b, h] 的 FP32 张量
print(pad("写法", 20), pad("rank", 6), pad("前向后多出 MiB", 15), pad("折合几个 sbh", 13), pad("其中输出 MiB", 12))
for kind, name in (("full", "整份"), ("tp", "张量并行"), ("sp", "张量并行+序列并行")):
    for rank in range(WORLD):
        r = res[rank][f"blk_{kind}"]
        print(pad(name, 20), pad(str(rank), 6), pad(f"{mib(r['held']):.2f}", 15), pad(f"{r['held'] / SBH:.2f}", 13),
              pad(f"{mib(r['out']):.2f}", 12))
print(f"（1 个 sbh = [s, b, h] 的 FP32 张量 = {mib(SBH):.2f} MiB）")
publish("sbh_mib", mib(SBH), fmt="{:.2f}")
for kind in ("full", "tp", "sp"):
    publish(f"held_{kind}_sbh", res[0][f"blk_{kind}"]["held"] / SBH, fmt="{:.2f}")
publish("sp_extra_sbh", res[0]["blk_sp"]["held"] / SBH - 5, fmt="{:.2f}")
publish("sp_extra_mib", mib(res[0]["blk_sp"]["held"] - 5 * SBH), fmt="{:.1f}")
full = [res[r]["blk_full"] for r in range(WORLD)]
for rank in range(WORLD):
    sp, tp = res[rank]["blk_sp"], res[rank]["blk_tp"]
    rows, cols = sp["rows"], slice(rank * 4 * H // WORLD, (rank + 1) * 4 * H // WORLD)
    print(f"rank {rank}：序列并行的输出 = 整份输出的第 {rows.start}–{rows.stop - 1} 个 token，最大差 "
          f"{(sp['y'] - full[rank]['y'][rows]).abs().max().item():.1e}；x 梯度最大差 "
          f"{(sp['x_grad'] - full[rank]['x_grad'][rows]).abs().max().item():.1e}；fc 权重梯度最大差 "
          f"{(sp['fc_w_grad'] - full[rank]['fc_w_grad'][cols]).abs().max().item():.1e}")
publish("sp_err", tex(max(max((res[r]["blk_sp"]["y"] - full[r]["y"][res[r]["blk_sp"]["rows"]]).abs().max().item(),
                              (res[r]["blk_sp"]["x_grad"] - full[r]["x_grad"][res[r]["blk_sp"]["rows"]]).abs().max().item())
                          for r in range(WORLD))))

# %% [markdown]
# 按 FP32 数一数（每个 sbh 是一个 $[s, b, h]$ 张量）：整份时 `fc` 保存 LayerNorm 的输出（1 个 sbh）、GeLU 保存 `fc` 的输出（4）、`proj` 保存 GeLU 的输出（4），再加块的输出（1），共 10 个 sbh；LayerNorm 还保存它的输入 $x$，但 $x$ 在前向之前就在设备上了，不算在“多出”的里面（另有 LayerNorm 的均值和方差倒数，很小）。张量并行只把两个 $4h$ 宽的张量切成一半（4 → 2、4 → 2），LayerNorm 的输出和块的输出仍是整份：6 个 sbh。序列并行把这两样也切成一半：5 个 sbh，正好是整份的 $1/t$；表里的 5.17 多出的 0.5 MiB 来自模拟的 CUDA 缓存分配器的记账：一个 1.5 MiB 的请求复用了缓存里一块 2 MiB 的空闲块，剩下的 0.5 MiB 不到 1 MiB，按规则不切分，整块记在它名下（`dev.top_allocations()` 能看到），真卡上同样会有。块的输入 $x$ 本身在序列并行下也只有 $[s/t, b, h]$。这就是 Korthikanti 等人公式里 $10sbh$ 那一项（LayerNorm 和 dropout 的激活值）在序列并行下也除以 $t$ 的原因；真实模型里还有注意力和 dropout 掩码，第 4 部分用完整公式算。
#
# ### 2.2 PyTorch 的写法：`parallelize_module`
#
# 手写是为了看清楚每一步。实际工程里，PyTorch 的 `torch.distributed.tensor.parallel` 用 DTensor 表达同样的切分：`ColwiseParallel` 把 `nn.Linear` 的权重按第 0 维（输出特征）切成 `Shard(0)`，`RowwiseParallel` 按第 1 维（输入特征）切成 `Shard(1)`，并在输出处做全规约。

# %%
for rank in range(WORLD):
    d = res[rank]["dtensor"]
    err = (d["y"] - res[rank]["mlp_full"]["y"]).abs().max().item()
    print(f"rank {rank}：本地权重形状 fc {d['shapes'][0]}，proj {d['shapes'][1]}；"
          f"placements {d['placements'][0]} / {d['placements'][1]}；与整份输出的最大差 {err:.1e}")
publish("dtensor_err", tex(max((res[r]["dtensor"]["y"] - res[r]["mlp_full"]["y"]).abs().max().item() for r in range(WORLD))))

# %% [markdown]
# ## 3. 流水线并行：GPipe 与 1F1B 各挂着几个微批次
#
# 流水线并行把模型按层切成 $p$ 段（stage），每段放在一张卡上；一个批次再切成 $m$ 个微批次（micro-batch），依次流过各段。每段的参数只有 $1/p$，但每段要为“已经做完前向、还没做反向”的微批次留着激活值：
#
# - **GPipe**：先做完全部 $m$ 个微批次的前向，再做反向。每一段都同时挂着 $m$ 个微批次的激活值。
# - **1F1B**（PipeDream-Flush，Megatron-LM 的默认调度）：第 $s$ 段（从 0 数）先做 $p - s - 1$ 个前向“预热”，之后前向一个、反向一个交替进行。第 $s$ 段最多挂着 $p - s$ 个微批次，第 0 段最多，$p$ 个，与 $m$ 无关。
#
# 显存只取决于**本段**按什么顺序做前向和反向，与别的段何时做无关。所以可以在一个进程里逐段重放：对第 $s$ 段建一个新设备，放上它的那几层，按调度顺序执行——前向时输入是一个需要梯度的张量（代表从上一段收到的激活值），反向时用一个随机张量代表从下一段收到的梯度。模型用 GPT-2 small 的 12 个 block（$h = 768$），每个微批次 1 条、序列长度 512，$m = 8$。

# %% tags=["pipeline"]
cfg = make_config("gpt2-small", "sdpa", 0.0)
FAKE = not ON_GPU
MB, SEQ, M = 1, 512, 8


def schedule(kind, s, p, m):
    """第 s 段（0 起）的操作顺序：[("F", i) / ("B", i)]。"""
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(p - s - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def replay_stage(kind, s, p, m=M, n_layer=12):
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    per = n_layer // p
    with vramlab.open_device("auto", fake=FAKE) as dev, torch.device(dev.torch_device):
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(GPT2Block(cfg, layer_idx=s * per + j) for j in range(per))
        param_bytes = sum(q.nbytes for q in blocks.parameters())
        dev.reset_peak()
        live, inflight, max_inflight, trace = {}, 0, 0, []
        for op, i in schedule(kind, s, p, m):
            if op == "F":
                x = torch.randn(MB, SEQ, cfg.n_embd, requires_grad=True)    # 从上一段收到的激活值
                y = x
                for blk in blocks:
                    y = blk(y)
                    y = y[0] if isinstance(y, tuple) else y
                live[i] = (x, y)
                inflight += 1
            else:
                x, y = live.pop(i)
                y.backward(torch.randn_like(y))                            # 从下一段收到的梯度
                del x, y                                                   # x.grad 发给上一段后就释放
                inflight -= 1
            max_inflight = max(max_inflight, inflight)
            trace.append(dev.allocated())
        peak = dev.max_allocated()
        blocks.zero_grad(set_to_none=True)
    return dict(peak=peak, params=param_bytes, max_inflight=max_inflight, trace=trace)


t0 = time.perf_counter()
pipe = {("gpipe", 4): replay_stage("gpipe", 0, 4)}   # GPipe 下各段的层数和操作顺序都相同，只重放第 0 段
for s in range(4):
    pipe[("1f1b", s)] = replay_stage("1f1b", s, 4)
p2 = replay_stage("1f1b", 0, 2)                      # 对照：p = 2 时的第 0 段（6 层）
print(f"重放完成（{'CUDA' if ON_GPU else '模拟设备，FakeTensorMode'}），用时 {time.perf_counter() - t0:.0f} 秒")
g = pipe[("gpipe", 4)]
print(f"p = 4、m = {M}，每段 3 层，参数 {mib(g['params']):.1f} MiB")
print(pad("段", 4), pad("GPipe 峰值 MiB", 15), pad("挂着", 6), pad("1F1B 峰值 MiB", 15), pad("挂着", 6), "1F1B/GPipe")
for s in range(4):
    o = pipe[("1f1b", s)]
    print(pad(str(s), 4), pad(f"{mib(g['peak']):.1f}", 15), pad(str(g["max_inflight"]), 6),
          pad(f"{mib(o['peak']):.1f}", 15), pad(str(o["max_inflight"]), 6), f"{o['peak'] / g['peak']:.2f}")
print("（“挂着”= 同时保存着激活值的微批次个数的最大值）")
o4 = pipe[("1f1b", 0)]
print(f"\n对照：p = 2 时 1F1B 的第 0 段（6 层，参数 {mib(p2['params']):.1f} MiB）峰值 {mib(p2['peak']):.1f} MiB，挂着 {p2['max_inflight']} 个；"
      f"去掉参数和梯度后 {mib(p2['peak'] - 2 * p2['params']):.1f} MiB")
print(f"      p = 4 时 1F1B 的第 0 段（3 层，参数 {mib(o4['params']):.1f} MiB）峰值 {mib(o4['peak']):.1f} MiB，挂着 {o4['max_inflight']} 个；"
      f"去掉参数和梯度后 {mib(o4['peak'] - 2 * o4['params']):.1f} MiB")
for key, r in (("p2", p2), ("p4", o4)):
    publish(f"{key}_stage0_peak_mib", mib(r["peak"]), fmt="{:.1f}")
    publish(f"{key}_stage0_params_mib", mib(r["params"]), fmt="{:.1f}")
    publish(f"{key}_stage0_act_mib", mib(r["peak"] - 2 * r["params"]), fmt="{:.1f}")
    publish(f"{key}_stage0_inflight", r["max_inflight"])

# %% [markdown]
# GPipe 下每一段都挂着全部 8 个微批次；1F1B 下第 $s$ 段最多挂 $p - s$ 个，第 0 段最满。再看对照的两行：$p = 4$ 时第 0 段有 3 层、挂 4 个微批次，$p = 2$ 时第 0 段有 6 层、挂 2 个，“层数 × 微批次数”都是 12，去掉参数和梯度（峰值出现在第一次反向时，梯度已经分配，和参数一样大）之后的字节数几乎一样。这是 Korthikanti 等人指出的规律：1F1B 下第一段的激活值约等于“整个模型跑一个微批次”的激活值，与 $p$ 无关（$L/p$ 层 × $p$ 个微批次）。流水线切得再细，也只有参数（以及梯度、优化器状态）随 $p$ 变小。
#
# 把 $p = 4$ 时第 0 段的已分配字节随操作的变化画出来：

# %%
import matplotlib
import matplotlib.pyplot as plt
from vramlab.display import use_cjk_font

ZH = use_cjk_font()          # 没有中文字体时只用英文标签，避免出现方框

fig, ax = plt.subplots(figsize=(8, 3.6))
for kind, label in (("gpipe", "GPipe"), ("1f1b", "1F1B")):
    tr = pipe[(kind, 4) if kind == "gpipe" else (kind, 0)]["trace"]
    ax.step(range(1, len(tr) + 1), [mib(v) for v in tr], where="post", label=label)
ax.set_xlabel("第几个操作（F 或 B）" if ZH else "operation index (F or B)")
ax.set_ylabel("每个操作之后的已分配 (MiB)" if ZH else "allocated after each op (MiB)")
ax.set_title("p = 4，第 0 段（GPT-2 small 的 3 层），m = 8" if ZH else "p = 4, stage 0 (3 GPT-2 small layers), m = 8")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ### 3.1 气泡：用时间模型核对公式
#
# 流水线的代价是气泡（bubble）：开头各段等着第一个微批次流下来，结尾各段等着最后一个反向传回去。设前向一段用 1 个单位时间、反向用 2 个，按依赖关系（第 $s$ 段的前向要等第 $s-1$ 段的同一微批次前向完成，反向要等第 $s+1$ 段的反向完成）排出每个操作的开始时间，就得到每段的空闲比例。

# %%
def simulate(kind, p, m, tf=1, tb=2):
    done, free, spans = {}, [0] * p, {s: [] for s in range(p)}
    queues = {s: schedule(kind, s, p, m) for s in range(p)}
    pos = [0] * p
    while any(pos[s] < len(queues[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(queues[s]):
                continue
            op, i = queues[s][pos[s]]
            dep = ("F", s - 1, i) if op == "F" and s > 0 else ("B", s + 1, i) if op == "B" and s < p - 1 else None
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done.get(dep, 0))
            end = start + (tf if op == "F" else tb)
            done[(op, s, i)], free[s] = end, end
            spans[s].append((start, end, op, i))
            pos[s] += 1
            progressed = True
        assert progressed
    total = max(free)
    return total, 1 - m * (tf + tb) / total, spans


print(pad("p", 3), pad("m", 4), pad("GPipe 气泡", 11), pad("1F1B 气泡", 11), pad("(p-1)/(m+p-1)", 15), "(p-1)/m")
for p, m in ((4, 1), (4, 4), (4, 8), (4, 16), (4, 32), (8, 32)):
    g, o = simulate("gpipe", p, m)[1], simulate("1f1b", p, m)[1]
    print(pad(str(p), 3), pad(str(m), 4), pad(f"{g:.3f}", 11), pad(f"{o:.3f}", 11), pad(f"{(p - 1) / (m + p - 1):.3f}", 15),
          f"{(p - 1) / m:.3f}")
    if (p, m) == (4, 8):
        publish("bubble_gpipe_p4_m8", g, fmt="{:.1%}")
        publish("bubble_1f1b_p4_m8", o, fmt="{:.1%}")

# %% [markdown]
# 两种调度的气泡一模一样，都是 $(p-1)/(m+p-1)$（占总时间的比例）；Narayanan 等人写成 $(p-1)/m$，那是“气泡时间 / 理想计算时间”，分母不同，$m \gg p$ 时两者接近。1F1B 没有缩小气泡，它省的是显存。把 $p = 4$、$m = 8$ 的两种调度画出来（数字是微批次编号，浅色是前向、深色是反向）：

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True)
for ax, kind, title in zip(axes, ("gpipe", "1f1b"), ("GPipe", "1F1B")):
    total, bubble, spans = simulate(kind, 4, 8)
    for s in range(4):
        for start, end, op, i in spans[s]:
            ax.barh(s, end - start, left=start, color="#9ecae1" if op == "F" else "#3182bd", edgecolor="white")
            ax.text((start + end) / 2, s, str(i), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(4))
    ax.set_yticklabels([f"stage {s}" for s in range(4)])
    ax.invert_yaxis()
    ax.set_title(f"{title}：{'气泡' if ZH else 'bubble'} {bubble:.1%}" if ZH else f"{title}: bubble {bubble:.1%}", fontsize=10)
axes[-1].set_xlabel("时间（前向 1 个单位，反向 2 个单位）" if ZH else "time (forward = 1 unit, backward = 2 units)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 4. 解析表：每层激活值与 1D / 2D 张量并行
#
# Korthikanti 等人对一个标准 Transformer 层（16 位激活值、GeLU 的 MLP 宽 $4h$、注意力分数矩阵要物化）给出每层激活值的字节数，$s$ 是序列长度、$b$ 是微批次大小、$h$ 是隐藏维度、$a$ 是注意力头数、$t$ 是张量并行度：
#
# | 做法 | 每层激活值（字节） |
# |---|---|
# | 不并行 | $sbh\left(34 + \dfrac{5as}{h}\right)$ |
# | 张量并行 | $sbh\left(10 + \dfrac{24}{t} + \dfrac{5as}{ht}\right)$ |
# | 张量并行 + 序列并行 | $\dfrac{sbh}{t}\left(34 + \dfrac{5as}{h}\right)$ |
# | 再加选择性重算 | $\dfrac{34\,sbh}{t}$ |
# | 全量重算 | $2sbh$（只存每层输入） |
#
# 用 GPT-3 175B 的形状（$h = 12288$、$a = 96$、96 层、$s = 2048$，Brown 等人 2020 年表 2.1），$b = 1$、$t = 8$ 代入：

# %%
def act_per_layer(s, b, h, a, t=1, sp=False, selective=False, full_recompute=False):
    if full_recompute:
        return 2 * s * b * h
    if selective:
        return 34 * s * b * h / t
    if sp:
        return s * b * h / t * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


GiB = 1024**3
s, b, h, a, L, t = 2048, 1, 12288, 96, 96, 8
rows = [("不并行", dict()), ("张量并行 t=8", dict(t=t)), ("张量并行 + 序列并行", dict(t=t, sp=True)),
        ("+ 选择性重算", dict(t=t, selective=True)), ("全量重算（不并行）", dict(full_recompute=True))]
print(pad("做法", 22), pad("每层 MiB", 10), pad(f"{L} 层 GiB", 10))
for name, kw in rows:
    v = act_per_layer(s, b, h, a, **kw)
    print(pad(name, 22), pad(f"{mib(v):.1f}", 10), pad(f"{v * L / GiB:.1f}", 10))
    key = {"不并行": "none", "张量并行 t=8": "tp", "张量并行 + 序列并行": "sp", "+ 选择性重算": "selective",
           "全量重算（不并行）": "full_recompute"}[name]
    publish(f"gpt3_{key}_layer_mib", mib(v), fmt="{:.1f}")
    publish(f"gpt3_{key}_model_gib", v * L / GiB, fmt="{:.1f}")
publish("gpt3_sbh_mib", mib(s * b * h), fmt="{:.0f}")            # 公式里的 sbh 按字节计
publish("gpt3_10sbh_mib", mib(10 * s * b * h), fmt="{:.0f}")
print(f"5as/h = {5 * a * s / h:.0f}，比 34 还大：注意力分数那一项在这个形状下是大头")

# %% [markdown]
# 最后是 1D / 2D / 2.5D / 3D 张量并行的比较。以一个线性层 $Y = XA$ 为例（$X$ 是 $[bs, h]$，$A$ 是 $[h, 4h]$），$P = 64$ 个 rank：1D（Megatron）把 $A$ 按列切 64 份，$X$ 每个 rank 一整份；2D（Optimus，基于 SUMMA）把 $X$ 和 $A$ 都切成 $q \times q$ 块，$q = 8$；2.5D（Tesseract）在 2D 上再加一个深度 $d$，$P = q^2 d$，这里取 $q = 4$、$d = 4$；3D 把 $P = q^3$ 个 rank 排成立方体，$q = 4$。每个 rank 存的份额按 Colossal-AI 文档的切分方式算；通信一列是该文档给出的量级（环形算法，前向加反向），只用来比较随 $P$ 的增长趋势。

# %%
bs, h = 8 * 2048, 12288          # 例如 8 条 2048 长的序列，h 取 GPT-3 175B 的隐藏维度；BF16 每元素 2 字节
X, A, Y = bs * h * 2, h * 4 * h * 2, bs * 4 * h * 2
P = 64
schemes = [("1D（Megatron）", "P=64", 1 / P, 1.0, 1 / P, 2 * (P - 1) / P),
           ("2D（Optimus）", "q=8", 1 / 64, 1 / 64, 1 / 64, 6 * (8 - 1) / 8),
           ("2.5D（Tesseract）", "q=4,d=4", 1 / 16, 1 / 64, 1 / 64, 3 * (4 - 1) * (4 + 1) / (4 * 4)),
           ("3D", "q=4", 1 / 64, 1 / 64, 1 / 64, 6 * (4 - 1) / 4**3)]
print(pad("方案", 20), pad("网格", 9), pad("A 的份额", 9), pad("A MiB", 8), pad("X MiB", 8), pad("Y MiB", 8), "通信量级")
for name, grid, fa, fx, fy, comm in schemes:
    print(pad(name, 20), pad(grid, 9), pad(f"1/{round(1 / fa)}", 9), pad(f"{mib(A * fa):.1f}", 8),
          pad(f"{mib(X * fx):.1f}", 8), pad(f"{mib(Y * fy):.1f}", 8), f"{comm:.3f}")
print(f"整份：A {mib(A):.0f} MiB，X {mib(X):.0f} MiB，Y {mib(Y):.0f} MiB")
publish("linear_a_rank_mib", mib(A / P), fmt="{:.1f}")
publish("linear_a_25d_mib", mib(A / 16), fmt="{:.1f}")
publish("linear_y_rank_mib", mib(Y / P), fmt="{:.1f}")
publish("linear_x_1d_mib", mib(X), fmt="{:.1f}")
publish("linear_x_rank_mib", mib(X / 64), fmt="{:.1f}")

# %% [markdown]
# 读法：1D 的权重切得和别的方案一样细，但每个 rank 都要一整份输入 $X$（384 MiB），这就是 Colossal-AI 表里 1D 的激活值是 $O(1)$ 的意思；序列并行正是为了补上这一块。2D / 2.5D / 3D 把激活值也切成 $1/P$（2.5D 的权重只切 $q^2$ 份，在 $d$ 层之间复制，用显存换更少的通信）。通信一列只是量级：它们的通信模式（广播、规约）和次数不同，实际快慢要看网络拓扑，不能直接拿这列数字比时间。
#
# 本教程测到的东西：张量并行把权重和 $4h$ 宽的中间张量切成 $1/t$，但输入、输出和 LayerNorm 这些 $[b, s, h]$ 的张量仍是整份，序列并行再把它们切开；流水线并行的参数随 $p$ 变少，1F1B 让第 $s$ 段最多挂 $p - s$ 个微批次的激活值（GPipe 是 $m$ 个），两种调度的气泡一样大。
