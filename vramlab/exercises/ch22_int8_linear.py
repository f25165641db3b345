"""第 22 章 INT8 权重的线性层：别把整块权重反量化出来（ch22-int8-linear）.

Kind "call" (case int8_linear): x [tokens, d_in] float32, weight_int8 [d_out, d_in] int8 with one
scale per output channel (absmax / 127), all on the device; `int8_linear` returns
x @ (weight_int8 * scale[:, None]).T, forward only. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def int8_linear(x, weight_int8, scale):
    """先把整块 INT8 权重反量化成 FP32，再做矩阵乘：结果对，
    但反量化出来的权重是 INT8 的 4 倍大，中间还有一份同样大的临时张量，量化省下的显存全还回去了。"""
    weight = weight_int8.to(x.dtype) * scale[:, None]      # [d_out, d_in]，FP32
    return x @ weight.T
'''

SOLUTION = '''\
import torch


def int8_linear(x, weight_int8, scale, block_rows=256):
    """按输出通道分块反量化：每次只把 block_rows 行权重变回浮点，算完这一块输出就丢掉。
    真实的 weight-only 内核在寄存器和共享内存里按 tile 反量化，整块浮点权重从来不出现在显存里。"""
    out = torch.empty(x.shape[0], weight_int8.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, weight_int8.shape[0], block_rows):
        rows = slice(start, start + block_rows)
        block = weight_int8[rows].to(x.dtype)               # [block_rows, d_in]
        torch.matmul(x, block.T, out=out[:, rows])
        out[:, rows] *= scale[rows]                         # 每个输出通道的缩放系数最后再乘
    return out
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch22-int8-linear",
    chapter=22,
    title="INT8 权重的线性层：按块反量化，不要整块还原",
    task=(
        "`int8_linear(x, weight_int8, scale)` 计算一个**仅权重量化**（weight-only INT8）的线性层："
        "`x` 是 `[tokens, d_in]` 的 FP32 激活值，`weight_int8` 是 `[d_out, d_in]` 的 INT8 权重，"
        "`scale` 是 `[d_out]` 的 FP32 缩放系数（每个输出通道一个，absmax / 127），都已经在设备上。"
        "结果是 `x @ (weight_int8 * scale[:, None]).T`，类型与 `x` 相同（只做前向，推理）。\n\n"
        "起始代码先把**整块**权重反量化成 FP32 再相乘：量化省下的显存在这一步全还了回去。"
        "请**按输出通道分块**反量化：每次只还原一块行，算出这一块输出就丢掉，结果与起始代码一致。"
    ),
    function="int8_linear",
    signature="def int8_linear(x, weight_int8, scale):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=64, steps=1, warmup=0,
             settings=call.Settings(case="int8_linear", d_in=2048, d_out=4096, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=1, warmup=0,
              settings=call.Settings(case="int8_linear", d_in=8192, d_out=28672)),
    target_ratio=0.5,
    rtol=1e-4,
    points=10,
    kind="call",
    hints=(
        "先 `out = torch.empty(tokens, d_out, ...)`，再按 `range(0, d_out, block)` 循环，每次只反量化 `weight_int8[rows]`。",
        "`torch.matmul(x, block.T, out=out[:, rows])` 直接写进输出，不再多一份临时结果。",
        "缩放系数是按输出通道的：`(x @ q.T) * scale` 与 `x @ (q * scale[:, None]).T` 相等，可以最后再乘。",
    ),
)
