"""第 22 章 INT8 权重的线性层：别把整块权重反量化出来（ch22-int8-linear）.

Kind "call" (case int8_linear): x [tokens, d_in] float32, weight_int8 [d_out, d_in] int8 with one
scale per output channel (absmax / 127), all on the device; `int8_linear` returns
x @ (weight_int8 * scale[:, None]).T, forward only. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def int8_linear(x, weight_int8, scale):
    """先把 INT8 权重反量化成 FP32，再做矩阵乘。
    结果是对的，但峰值显存远远高于 INT8 权重本身，量化省下的显存又还了回去。"""
    weight = weight_int8.to(x.dtype) * scale[:, None]      # [d_out, d_in]，FP32
    return x @ weight.T
'''

TARGET_NOTE = ("Measured on the sim at ci scale (x 128 x 2048, weight 4096 x 2048 int8, cuBLAS workspace off; "
               "torch 2.13.0+cpu, 2026-12-02; `vramlab grade ch22-int8-linear <file>` on the reference and "
               "tests/alternatives/ch22-int8-linear/): starter 73.02 MiB; the reference (256 output channels at a "
               "time, out=) 0.21x, torch.chunk into 16 row groups + torch.cat 0.18x, 256 input columns at a time "
               "accumulated 0.23x; the scale folded onto the output but the whole weight dequantized 0.59x, the "
               "whole weight dequantized and then sliced 1.00x. Hidden case (x 96 x 1536, weight 4800 x 1536): "
               "reference 0.19x, chunk + cat 0.17x, input columns 0.25x; a loop over the visible d_out leaves "
               "columns unwritten. Target 0.50x.")

SPEC = ExerciseSpec(
    id="ch22-int8-linear",
    chapter=22,
    title="INT8 权重的线性层：别把省下的显存还回去",
    task=(
        "`int8_linear(x, weight_int8, scale)` 计算一个**仅权重量化**（weight-only INT8）的线性层："
        "`x` 是 `[tokens, d_in]` 的 FP32 激活值，`weight_int8` 是 `[d_out, d_in]` 的 INT8 权重，"
        "`scale` 是 `[d_out]` 的 FP32 缩放系数（每个输出通道一个，absmax / 127），都已经在设备上。"
        "结果是 `x @ (weight_int8 * scale[:, None]).T`，类型与 `x` 相同（只做前向，推理）。\n\n"
        "起始代码的结果是对的，但函数运行期间的峰值显存远远高于 INT8 权重、`x` 和输出加起来的大小："
        "把权重量化成 INT8 省下的显存，在这一步又全还了回去。请改写它，把峰值降到目标以下，"
        "结果与起始代码一致。你看不到的配置里 `d_in`、`d_out` 和 token 数都可能不同。"
    ),
    function="int8_linear",
    signature="def int8_linear(x, weight_int8, scale):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=2, seq=64, steps=1, warmup=0,
             settings=call.Settings(case="int8_linear", d_in=2048, d_out=4096, cublas_workspace=False),
             hidden=(Variation(catches="a loop over the visible d_out (range(0, 4096, ...)) or an output of the "
                                       "visible shape; d_out 4800 is no multiple of 256; fewer tokens and a "
                                       "smaller weight, so it costs less",
                               seq=48, settings={"d_in": 1536, "d_out": 4800}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=1, warmup=0,
              settings=call.Settings(case="int8_linear", d_in=8192, d_out=28672)),
    target_ratio=0.5,
    rtol=1e-4,
    points=10,
    kind="call",
    giveaways=(r"block", r"chunk", r"split\(", r"range\(\s*0\s*,", r"out\s*=\s*out", r"分块", r"按块"),
    hints=(
        "峰值出现时，显存里除了 `x`、INT8 权重和输出，还有哪些张量？它们各是 INT8 权重的几倍大？"
        "算一次矩阵乘，真的需要整块浮点权重同时存在吗？",
        "输出的第 j 列只依赖权重的第 j 行（一个输出通道）和 `scale[j]`：拿几行权重就能算出输出的几列，"
        "这几行用完就可以丢掉。缩放系数按输出通道，`(x @ q.T) * scale` 与 `x @ (q * scale[:, None]).T` 相等，"
        "可以最后再乘到输出上。",
        "先 `out = torch.empty(tokens, d_out, ...)`，再 `for start in range(0, d_out, block)`：每次只把 "
        "`weight_int8[start:start + block]` 反量化成浮点，`torch.matmul(x, w.T, out=out[:, start:start + block])` "
        "直接写进输出，最后按列乘 `scale`（按块反量化）。",
    ),
)
