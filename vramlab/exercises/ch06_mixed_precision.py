"""第 6 章 混合精度（ch06-mixed-precision)."""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, plain_train_step

STARTER = plain_train_step('全 fp32 训练一步：正确，但每个矩阵乘法的输出（激活值）都是 4 字节一个数。')

SOLUTION = '''\
import torch


def train_step(model, optimizer, batch, device):
    """bf16 自动混合精度：前向放进 torch.autocast，矩阵乘法用 bf16 计算并保存 bf16 激活值；
    参数、梯度和优化器状态仍是 fp32。bf16 的指数范围与 fp32 相同，不需要 GradScaler。"""
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''

# The ci model: `tiny` narrowed to 64 wide (2 heads), 4 layers, a 256-token vocabulary, with the exact
# GELU. GPT-2's default `gelu_new` computes x**3 with torch.pow, which autocast keeps in fp32 (it is on
# CUDA's fp32 list), so the 4x-wide MLP activation would be saved in fp32 either way and bf16 would save
# little. With `gelu` (F.gelu runs in bf16) matmul/MLP activations dominate. Narrow on purpose: a CPU
# without bf16/fp16 matrix units multiplies in those dtypes 5-40x slower than in fp32 (GPT-2's Conv1D
# addmm layout is the slowest), so the earlier 256-wide model took ~35 s per bf16 step and ~110 s
# to grade; the activations-to-weights balance, which sets the ratio, is kept by the narrow width.
CI_CONFIG = {"n_embd": 64, "n_head": 2, "n_layer": 4, "vocab_size": 256, "activation_function": "gelu"}

TARGET_NOTE = ("Measured on the sim at ci scale (CI_CONFIG, batch 8, seq 128, cuBLAS workspaces off): starter 22.5 MiB, "
               "bf16 autocast solution 15.8 MiB = 0.70x, fp16 autocast + GradScaler the same; about 1.5 s per "
               "low-precision step on a 2-core CPU. Target 0.85x (0.15 margin). Loss tolerance rtol 1e-2 (bf16 keeps "
               "~3 significant digits per op; the loss is computed in fp32); update tolerance 0.25 (a skipped or "
               "doubled step gives >= 1). Pure bf16 training (parameters cast) is refused by the technique check "
               "(fp32 parameters, gradients and optimizer state), not by these tolerances.")

SPEC = ExerciseSpec(
    id="ch06-mixed-precision",
    chapter=6,
    title="混合精度：用 bf16 autocast 减少激活值显存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码全程 fp32：前向中每个矩阵乘法的输出都按 4 字节保存，留给反向使用。\n"
        "请用**自动混合精度**：把前向（计算损失的那一行）放进 "
        "`torch.autocast(device.type, dtype=torch.bfloat16)`。矩阵乘法会以 bf16 计算，"
        "保存给反向的激活值只占一半；layer norm、softmax、损失等对范围敏感的运算 autocast 会自动留在 fp32。\n\n"
        "注意 `device.type`：在模拟设备上它是 `\"cpu\"`，在真 GPU 上是 `\"cuda\"`，"
        "同一份代码两边都能跑。\n\n"
        "要求：损失与 fp32 起始代码的差别在 bf16 的精度范围内（评分容差见下），"
        "参数更新方向一致，稳态峰值显存不超过目标比例。\n\n"
        "延伸：fp16 的指数范围小，梯度容易下溢，需要 `torch.amp.GradScaler`："
        "`scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`。"
        "本题用 bf16 就不需要它；用 fp16 加 GradScaler 也能通过。\n\n"
        "混合精度只让前向里的计算用低精度：参数、梯度（主权重）和优化器状态仍是 fp32。"
        "评分器在每次 `optimizer.step()` 时检查它们的 dtype，把参数整体转成 bf16 的“纯 bf16 训练”不算。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(config=CI_CONFIG, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(config={"activation_function": "gelu"})),
    target_ratio=0.85,
    rtol=1e-2,
    atol=1e-3,
    update_rtol=0.25,
    technique="autocast",
    points=10,
    hints=(
        "只把前向和损失放进 `with torch.autocast(device.type, dtype=torch.bfloat16):`，"
        "`loss.backward()` 和 `optimizer.step()` 放在 with 块外面。",
        "不要用 `model.to(torch.bfloat16)` 把参数整体转成 bf16：那是纯 bf16 训练，"
        "优化器更新会丢精度；评分器检查参数、梯度和优化器状态都还是 float32。",
        "如果改用 fp16，需要 `torch.amp.GradScaler(device.type)` 缩放损失，否则小梯度会下溢成 0。",
    ),
)
