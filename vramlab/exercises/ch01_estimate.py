"""第 1 章 估算静态显存（ch01-estimate）.

Kind "estimate": the learner's function gets numbers, not a device. The trusted (reference) child
measures every case on the simulated device: the model is built in the case's dtype (real `tiny` /
`llama-tiny`, `gpt2-mini` and larger under FakeTensorMode), one training step runs (the forward
under bf16 autocast for "bf16-mixed"), and the truth is parameters + gradients + optimizer_state of
`dev.breakdown(at_peak=False)` just before `zero_grad` (allocator rounding and AdamW's per-tensor
`step` scalars included; buffers are not parameters and these presets have none that count).
"""
from ..grader.kinds import estimate
from .spec import ExerciseSpec, Scale

STARTER = '''\
def estimate_static_bytes(n_params, optimizer, precision):
    """章节草稿里的公式：每个参数 2 字节，乘以（权重 + 梯度 + 2 份优化器状态）。
    它把所有情况都当成 bf16 + AdamW，对 fp32、SGD 和混合精度都算错了。"""
    return n_params * 2 * (1 + 1 + 2)
'''

SOLUTION = '''\
def estimate_static_bytes(n_params, optimizer, precision):
    """静态显存 = 参数 + 梯度 + 优化器状态，每一项都是“每个参数几字节”乘以参数量。
    - fp32：权重、梯度、状态都是 4 字节；
    - bf16（纯 bf16 训练）：三者都是 2 字节；
    - bf16-mixed（autocast 混合精度）：权重、梯度、状态仍是 fp32（4 字节），bf16 只用于激活值。
    优化器状态的份数：SGD 0 份，带动量的 SGD 1 份（momentum_buffer），AdamW 2 份（exp_avg、exp_avg_sq）。"""
    width = {"fp32": 4, "bf16": 2, "bf16-mixed": 4}[precision]
    states = {"sgd": 0, "sgdm": 1, "adamw": 2}[optimizer]
    return n_params * width * (1 + 1 + states)
'''

_ALL = [(o, p) for o in ("sgd", "sgdm", "adamw") for p in ("fp32", "bf16", "bf16-mixed")]

TARGET_NOTE = ("Measured on the sim (`vramlab grade-bench --starters`, per-case truths in the payload): bytes per "
               "parameter, tiny (593,408 params): sgd 8.00/4.01/8.00, sgdm 12.00/6.02/12.00, adamw 16.00/8.03/16.00 "
               "for fp32/bf16/bf16-mixed; llama-tiny and gpt2-mini (fake) within 0.2% and 1.6% of the formula "
               "(the allocator's rounding of gpt2-mini's 50257-row embedding grads); gpu-scale gpt2-small bf16 AdamW "
               "8.25 B/param (3.0%). Tolerance 5%: the formula passes every case (worst 3.0% at gpu scale, 1.6% at ci); "
               "the starter (8 B/param always) is 50% off for fp32 AdamW; forgetting the optimizer state or counting "
               "2 B for mixed-precision weights is >= 25% off somewhere.")

SPEC = ExerciseSpec(
    id="ch01-estimate",
    chapter=1,
    title="估算静态显存：参数、梯度与优化器状态",
    task=(
        "写 `estimate_static_bytes(n_params, optimizer, precision)`：给定参数个数、优化器和精度，"
        "返回训练时**静态显存**的字节数（整数）——参数 + 梯度 + 优化器状态，不含激活值。\n\n"
        "- `optimizer`：`\"sgd\"`（无状态）、`\"sgdm\"`（带动量的 SGD，每个参数一份 momentum_buffer）、"
        "`\"adamw\"`（每个参数两份：一阶矩 exp_avg 和二阶矩 exp_avg_sq）；\n"
        "- `precision`：`\"fp32\"`（权重、梯度、状态都是 fp32）、`\"bf16\"`（纯 bf16 训练：三者都是 bf16）、"
        "`\"bf16-mixed\"`（`torch.autocast` 混合精度：权重、梯度、优化器状态仍是 fp32，只有激活值是 bf16）。\n\n"
        "评分时，评分器在模拟设备上真的训练一步（tiny 等小模型直接算，较大的模型在 FakeTensorMode 下只算形状），"
        "在 `zero_grad` 之前读出 `breakdown()` 里参数、梯度、优化器状态三项之和，作为实测值。"
        "你的估算在每个用例（公开的 tiny 九种组合，以及几个隐藏模型）上都要与实测值相差不超过 5%。\n\n"
        "本题要用公式算：函数拿不到设备，也不要在函数里建模型、创建张量去测量（评分器会检查）。\n\n"
        "例：tiny 有 593,408 个参数，fp32 + AdamW 实测 9,494,528 字节，正好是每个参数 16 字节。"
    ),
    function="estimate_static_bytes",
    signature="def estimate_static_bytes(n_params, optimizer, precision):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=1, seq=16, steps=1, warmup=0, settings=estimate.Settings(
        visible=9,
        cases=[("tiny", o, p, False) for o, p in _ALL]
        + [("llama-tiny", "adamw", "bf16", False), ("llama-tiny", "sgdm", "bf16-mixed", False),
           ("gpt2-mini", "adamw", "bf16-mixed", True), ("gpt2-mini", "sgd", "bf16", True),
           ("gpt2-mini", "sgdm", "fp32", True)])),
    gpu=Scale(model="gpt2-small", batch=1, seq=16, steps=1, warmup=0, settings=estimate.Settings(
        visible=9,
        cases=[("tiny", o, p, False) for o, p in _ALL]
        + [("gpt2-small", o, p, True) for o, p in _ALL] + [("gpt2-medium", "adamw", "bf16-mixed", True)])),
    target_ratio=0.05,
    kind="estimate",
    points=10,
    hints=(
        "先写出“每个参数几字节”：权重 + 梯度 + 优化器状态，再乘以 n_params。",
        "AdamW 每个参数有两份状态（exp_avg、exp_avg_sq），与参数同一个 dtype；SGD 无动量时没有状态。",
        "混合精度（bf16-mixed）下，权重、梯度和优化器状态仍是 fp32：省下的是激活值，不是静态显存。",
    ),
)
