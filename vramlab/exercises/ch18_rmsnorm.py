"""第 18 章 RMSNorm 只为反向保存输入和每行统计量（ch18-rmsnorm）.

Kind "call" (case rms_norm): x [tokens, hidden] in bf16 (requiring grad) and one weight [hidden]
per layer on the device; the harness runs a residual stack of pre-norm layers
(h = h + rms_norm(h, w_i)), then backward with a fixed gradient; the output and all gradients are
compared with the starter's (bf16 rounding: rtol 1e-2 on the projections). One layer would only
measure backward temporaries; a stack measures what each call keeps for backward, as a model does.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def rms_norm(x, weight, eps):
    """Hugging Face LlamaRMSNorm 的写法：先转成 FP32 算，再转回输入的精度。
    结果和梯度都是对的，但叠成多层时峰值显存很高。"""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (x 1536 x 1024 bf16, 12 layers; torch 2.13.0+cpu, 2026-12-02; "
               "`vramlab grade ch18-rmsnorm <file>` on the reference and tests/alternatives/ch18-rmsnorm/): starter "
               "144.09 MiB; the reference (saves x and rstd) 0.48x, a Function saving the bf16 normalised output "
               "and rstd 0.48x, non-reentrant checkpoint around the starter's computation 0.54x; a Function saving "
               "the fp32 copy of x (the half fix) 0.71x, F.rms_norm 1.00x (decomposed on the CPU). Hidden case "
               "(x 1280 x 768, 12 layers): the same ratios (0.48x, 0.48x, 0.54x). Per layer the starter keeps 3 "
               "bf16-sized units for backward, the half fix 2, the reference 1: 12 layers, not 8 as before "
               "2026-12-02 (0.53x against a target of 0.75x, where the half fix passed at 0.72x), so that the "
               "half fix fails a target of 0.62x while checkpointing keeps its 10% margin. GPU scale (16 layers) not "
               "measured: by the same count (3, 2 and 1 units a layer over ~12 units that do not scale with the "
               "layers) about 0.47x, 0.73x and 0.5x.")

SPEC = ExerciseSpec(
    id="ch18-rmsnorm",
    chapter=18,
    title="RMSNorm：每层为反向留下了多少",
    task=(
        "`rms_norm(x, weight, eps)` 计算 RMSNorm：`weight * x / sqrt(mean(x²) + eps)`，其中 `x` 是 "
        "`[tokens, hidden]` 的 BF16 张量（需要梯度），均方在 FP32 里算。评分器对输出做反向传播，"
        "比较输出和 `x`、`weight` 的梯度（BF16 的舍入误差内）。评分器像 Transformer 一样把它叠成多层残差："
        "`h = h + rms_norm(h, w_i, eps)`，所以每次调用为反向留下的张量会逐层累加。\n\n"
        "起始代码是 Hugging Face `LlamaRMSNorm` 的写法：转成 FP32、逐步计算、再转回 BF16。结果和梯度都是对的，"
        "但每一层为反向留下的显存比这一层的输入本身还多。请改写它，把整个堆叠的峰值显存降到目标以下，"
        "输出和梯度与起始代码一致。你看不到的配置里宽度、层数和 token 数都可能不同。"
    ),
    function="rms_norm",
    signature="def rms_norm(x, weight, eps):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=384, steps=1, warmup=0,
             settings=call.Settings(case="rms_norm", hidden=1024, layers=12, dtype="bfloat16"),
             hidden=(Variation(catches="a mean written as a sum over 1024 columns (the visible hidden) normalises "
                                       "wrong at another width; fewer tokens and layers, so it costs less",
                               seq=320, settings={"hidden": 768}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=4096, steps=1, warmup=0,
              settings=call.Settings(case="rms_norm", hidden=4096, layers=16, dtype="bfloat16")),
    target_ratio=0.62,
    rtol=1e-2,
    points=10,
    kind="call",
    giveaways=(r"autograd\.Function", r"save_for_backward", r"saved_tensors", r"checkpoint"),
    hints=(
        "堆叠的每一层为反向保存了哪些张量？它们各有多大（和 BF16 的 x 比）？反向真正需要的又是哪些？",
        "归一化结果可以从 x 和每行一个数 rstd（`[tokens, 1]`）重新算出来。梯度公式可以自己写："
        "设 n = x·rstd，g = grad_out·w（都在 FP32 里算），则 dx = rstd·(g − n·mean(g·n))，"
        "dw = 沿 token 维对 grad_out·n 求和。这样前向只需要留下 x 和 rstd。",
        "写一个 `torch.autograd.Function`：前向 `ctx.save_for_backward(x, weight, rstd)`（x 保持 BF16），"
        "反向用上面的公式重算 n 再求梯度。不想推公式，也可以用 "
        "`torch.utils.checkpoint.checkpoint(原来的计算, x, weight, eps, use_reentrant=False)`，反向时重算一遍。",
    ),
)
