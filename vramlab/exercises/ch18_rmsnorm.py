"""第 18 章 RMSNorm 只为反向保存输入和每行统计量（ch18-rmsnorm）.

Kind "call" (case rms_norm): x [tokens, hidden] in bf16 (requiring grad) and one weight [hidden]
per layer on the device; the harness runs a residual stack of pre-norm layers
(h = h + rms_norm(h, w_i)), then backward with a fixed gradient; the output and all gradients are
compared with the starter's (bf16 rounding: rtol 1e-2 on the projections). One layer would only
measure backward temporaries; a stack measures what each call keeps for backward, as a model does.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def rms_norm(x, weight, eps):
    """Hugging Face LlamaRMSNorm 的写法：先转成 FP32 算，再转回输入的精度。
    自动求导为反向保存了 FP32 的输入副本和归一化后的 FP32 张量，都是 x 的两倍大。"""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)
'''

SOLUTION = '''\
import torch


class _RMSNorm(torch.autograd.Function):
    """只保存输入 x（原精度）和每行的 rstd（FP32，[tokens, 1]），反向时重算归一化结果。"""

    @staticmethod
    def forward(ctx, x, weight, eps):
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (h * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        h = x.float()
        n = (h * rstd).to(x.dtype)                                  # 重算归一化结果
        grad_weight = (grad_out * n).float().sum(0).to(weight.dtype)
        g = (grad_out * weight).float()                             # d loss / d n（FP32）
        dot = (g * h).mean(-1, keepdim=True)
        grad_x = (rstd * (g - h * rstd.pow(2) * dot)).to(x.dtype)
        return grad_x, grad_weight, None


def rms_norm(x, weight, eps):
    return _RMSNorm.apply(x, weight, eps)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch18-rmsnorm",
    chapter=18,
    title="RMSNorm：反向只需要输入和每行的统计量",
    task=(
        "`rms_norm(x, weight, eps)` 计算 RMSNorm：`weight * x / sqrt(mean(x²) + eps)`，其中 `x` 是 "
        "`[tokens, hidden]` 的 BF16 张量（需要梯度），均方在 FP32 里算。评分器对输出做反向传播，"
        "比较输出和 `x`、`weight` 的梯度（BF16 的舍入误差内）。评分器像 Transformer 一样把它叠成多层残差："
        "`h = h + rms_norm(h, w_i, eps)`，所以每次调用为反向保存的张量会逐层累加。\n\n"
        "起始代码是 Hugging Face `LlamaRMSNorm` 的写法：转成 FP32、逐步计算、再转回 BF16。自动求导为反向保存了"
        "两个 FP32 的全尺寸中间张量。请写一个 `torch.autograd.Function`：前向只保存 `x` 和每行的 "
        "`rstd`（`[tokens, 1]`），反向时重算归一化结果，自己写出梯度公式。"
    ),
    function="rms_norm",
    signature="def rms_norm(x, weight, eps):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=512, steps=1, warmup=0,
             settings=call.Settings(case="rms_norm", hidden=1024, layers=8, dtype="bfloat16")),
    gpu=Scale(model="gpt2-small", batch=8, seq=4096, steps=1, warmup=0,
              settings=call.Settings(case="rms_norm", hidden=4096, layers=16, dtype="bfloat16")),
    target_ratio=0.75,
    rtol=1e-2,
    points=10,
    kind="call",
    hints=(
        "设 n = x·rstd，y = w·n。对 x 的梯度：rstd · (g − n · mean(g · n))，其中 g = grad_out · w（都在 FP32 里算）。",
        "对 weight 的梯度：把 grad_out · n 沿 token 维求和。",
        "`ctx.save_for_backward(x, weight, rstd)`：x 保持 BF16，rstd 只有 [tokens, 1]。",
    ),
)
