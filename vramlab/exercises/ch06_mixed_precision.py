"""第 6 章 混合精度（ch06-mixed-precision)."""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('全 fp32 训练一步：正确，但每个矩阵乘法的输出（激活值）都是 4 字节一个数。')

# The ci model: `tiny` narrowed to 64 wide (2 heads), 4 layers, a 256-token vocabulary, with the exact
# GELU. GPT-2's default `gelu_new` computes x**3 with torch.pow, which autocast keeps in fp32 (it is on
# CUDA's fp32 list), so the 4x-wide MLP activation would be saved in fp32 either way and bf16 would save
# little. With `gelu` (F.gelu runs in bf16) matmul/MLP activations dominate. Narrow on purpose: a CPU
# without bf16/fp16 matrix units multiplies in those dtypes 5-40x slower than in fp32 (GPT-2's Conv1D
# addmm layout is the slowest), so the earlier 256-wide model took ~35 s per bf16 step and ~110 s
# to grade; the activations-to-weights balance, which sets the ratio, is kept by the narrow width.
CI_CONFIG = {"n_embd": 64, "n_head": 2, "n_layer": 4, "vocab_size": 256, "activation_function": "gelu"}

TARGET_NOTE = ("Measured on the sim at ci scale (CI_CONFIG, batch 8, seq 128, cuBLAS workspaces off; grade_source per "
               "file, VRAMLAB_GRADE_CORES=1, 2026-12-02), visible / hidden (3 layers, batch 8, seq 96, seed 1): starter "
               "22.5 MiB / 14.0 MiB; bf16 autocast solution 0.701x / 0.734x, fp16 autocast + GradScaler 0.701x / 0.734x "
               "(10% inside the 0.85 target: <= 0.765); about 1.5 s per low-precision step on a 2-core CPU. "
               "tests/alternatives/ch06-mixed-precision: pure_bf16_counter 0.62x but refused by the technique check "
               "(bf16 parameters, gradients, optimizer state), autocast_whole_step_counter (autocast around backward "
               "and step only) 1.00x, refused by the technique check; fitted_big_batches_only (autocast only from "
               "1024 tokens per step) passes visibly and falls back to fp32 in the hidden case (technique). "
               "A smaller hidden batch (6 x 96) puts the reference at 0.755x, too near the margin. Loss tolerance rtol "
               "1e-2 (bf16 keeps ~3 significant digits per op; the loss is computed in fp32); update tolerance 0.25 "
               "(a skipped or doubled step gives >= 1). 2026-12-05 (steady peaks via vramlab.exercise_setup, visible / "
               "hidden): the reference 0.702x / 0.736x; the common `out = model(...)` kept to the end of the step 0.724x / "
               "0.764x; the model under torch.amp.autocast and the loss computed outside it from fp32 logits 0.747x / "
               "0.786x; the trunk only under autocast 0.707x / 0.736x. At the former target 0.85 the 10% margin (<= "
               "0.765) refused the honest second and third in the hidden case; the target is 0.9 (margin <= 0.81): the "
               "technique check, not the ratio, is what refuses fp32 forwards and pure low-precision training.")

SPEC = ExerciseSpec(
    id="ch06-mixed-precision",
    chapter=6,
    title="混合精度：激活值用 16 位，主权重留在 FP32",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码全程 FP32：前向中每个矩阵乘法的输出都按 4 字节一个数保存，留给反向使用。"
        "请用本章的**混合精度训练**减少这部分显存，同时满足：\n\n"
        "1. 前向中的矩阵乘法用 16 位浮点计算，为反向保存的激活值随之减半；"
        "归一化、softmax、损失这类对数值范围敏感的运算仍用 FP32；\n"
        "2. **主权重不降精度**：参数、梯度和优化器状态始终是 float32。把模型整体转成 16 位的“纯低精度训练”"
        "虽然更省显存，但不算；\n"
        "3. 损失和参数更新与 FP32 起始代码的差别在 16 位精度的误差范围内（容差见下）；"
        "稳态峰值显存不超过起始代码的目标比例。\n\n"
        "两种 16 位格式都可以用；如果你选的格式指数范围小，小梯度会下溢成 0，要按本章的办法处理。"
        "`device.type` 在模拟设备上是 `\"cpu\"`，在真 GPU 上是 `\"cuda\"`，同一份代码要两边都能跑。\n\n"
        "怎么量：评分器用同样的模型、同样的数据先跑起始代码，再跑你的函数，比较每一步的损失、训练后参数的变化量，"
        "以及预热一步之后的最大已分配显存；你的代码运行时，它还在 Transformer block 的权重上看每次矩阵乘法实际用的 dtype，"
        "以及每次 `optimizer.step()` 时参数、梯度和优化器状态的 dtype。隐藏配置的层数、批大小和序列长度不同。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    # hidden: 3 layers, 8 x 96 tokens (fewer than the visible 8 x 128 on 4 layers: cheaper); code that
    # turns low precision on only for the visible shape falls back to fp32 there
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(config=CI_CONFIG, cublas_workspace=False),
             hidden=(Variation(catches="low precision switched on only for the visible shape (e.g. from 1024 tokens)",
                               seq=96, seed=1, config={"n_layer": 3}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(config={"activation_function": "gelu"})),
    target_ratio=0.9,
    rtol=1e-2,
    atol=1e-3,
    update_rtol=0.25,
    technique="autocast",
    points=10,
    hints=(
        "起始代码的前向里，哪些张量被留到了反向？它们每个数占几个字节？"
        "只让前向的计算换成 16 位的话，参数本身需要改变 dtype 吗？",
        "PyTorch 有一个上下文管理器：在它的作用范围内，矩阵乘法自动换成 16 位计算，对精度敏感的运算留在 FP32，"
        "参数不变（本章讲它“到底做了什么”的那一节）。只让前向和损失在它里面，反向和优化器更新放在外面。",
        "`with torch.autocast(device.type, dtype=torch.bfloat16):` 里只算 "
        "`loss = model(input_ids=batch, labels=batch).loss`；bf16 不需要 `GradScaler`，"
        "fp16 需要 `torch.amp.GradScaler(device.type)` 缩放损失。",
    ),
    giveaways=(r"autocast", r"bfloat16", r"float16", r"GradScaler", r"\bamp\."),
)
