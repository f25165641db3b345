"""第 30 章 综合调优：把一步训练装进一张放不下它的卡（ch30-capstone）.

Kind "train_step" on a virtual card (settings.learner_budget_mib) that the plain FP32 AdamW step
overflows; the trusted starter runs without the budget and gives the baseline. Host memory is
allowed (offload), and the correctness tolerances are loose enough for bf16 autocast and 8-bit
optimizer states (rtol 2e-2 on the losses, 10% on the update). The judge reports, per memory
category, how much the learner saved against the starter at the peak (settings.report_savings).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('''最朴素的一步：FP32 权重、FP32 激活值、整批一次前向、torch 的 AdamW（每个参数 8 字节状态）。
在评分用的虚拟显卡上，这一步放不下。''')

TARGET_NOTE = ("Measured on the sim at ci scale (VRAMLAB_GRADE_CORES=1, grade_source): starter 275.8 MiB visible "
               "(OOM on the 110 MiB card at step 1), 189.7 MiB on the hidden case (3 layers, batch 4 x 192, seed 1, "
               "100 MiB card; the reference overflows a 90 MiB one at step 2). Reference (HF checkpointing + 4 "
               "micro-batches + AdamW8bit) 0.280 visible (77.1 MiB) / 0.359 hidden (68.0 MiB); hand-written "
               "checkpoint + micro-batches of <= 2 rows + AdamW in host memory 0.242 / 0.385; checkpointing + "
               "8-bit states without micro-batches OOMs at step 1 (the full batch's logits); micro-batches cut "
               "with view(4, 2, 128) fail the hidden case (exception). Target 0.5; the card is what binds.")

SPEC = ExerciseSpec(
    id="ch30-capstone",
    chapter=30,
    title="综合调优：从 OOM 到一步训练装进虚拟显卡",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回这一步的损失（Python `float`，整个 batch 的平均）。\n\n"
        "评分器把你的代码放在一张**虚拟显卡**上运行；起始代码（FP32 权重和激活值、整批一次前向、torch 的 AdamW）"
        "在这张卡上第一步就 OOM。请让完整的一步装进这张卡，而且峰值不超过起始代码（在不限显存时测得）的目标比例。"
        "没有哪一招单独做得到：先弄清起始代码的峰值由哪几类显存组成，再用本课程学过的技术分别对付它们。"
        "本题允许把张量放进主存（`device.host()`、`device.to_host()`、`device.to_device()`、`device.save_on_cpu()`），"
        "也可以使用 `bitsandbytes`。\n\n"
        "**损失仍然要对**：损失与起始代码相差不超过 2%，参数更新相差不超过 10%（给低精度计算和低精度优化器状态留了余地）。"
        "评分报告会按显存类别（参数、梯度、优化器状态、激活值、临时张量）列出你比起始代码省了多少，告诉你每种技术各买到了多少显存。"
        "隐藏配置的模型形状、批大小和卡的大小都与你看到的不同，不要把 batch 的形状或切分方式写死。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, allow_host=True, learner_budget_mib=110,
                                          report_savings=True, bitsandbytes=True,
                                          config={"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 8192}),
             hidden=(Variation(catches="micro-batches cut with the visible shapes written in (rows of 2 out of 8, "
                                       "a view with seq 128) break on another batch and sequence length",
                               batch=4, seq=192, seed=1, config={"n_layer": 3},
                               settings={"learner_budget_mib": 100}),)),
    gpu=Scale(model="gpt2-medium", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(allow_host=True, learner_budget_mib=16384, report_savings=True,
                                           bitsandbytes=True)),
    target_ratio=0.5,
    rtol=2e-2,
    atol=1e-3,
    update_rtol=0.1,
    points=20,
    hints=(
        "起始代码在不限显存时，峰值出现在哪一刻？那一刻参数、梯度、优化器状态、激活值、临时张量各占多少？"
        "（在笔记本里用 `device.breakdown()` 看。）",
        "三类显存各有一招：为反向保存的激活值可以不存、到时重算；logits 和交叉熵的临时张量随一次前向的样本数变大，"
        "可以分几次前向（损失要按份数缩放）；AdamW 每个参数 8 字节的状态可以压成更低的精度。",
        "激活值：`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})`；"
        "临时张量：`for micro in batch.chunk(k)` 做梯度累积；优化器状态："
        "`bitsandbytes.optim.AdamW8bit(model.parameters(), min_8bit_size=0, ...)`，第一次调用时创建并存在模型上。",
    ),
    giveaways=(r"gradient_checkpointing_enable", r"utils\.checkpoint", r"AdamW8bit", r"PagedAdamW", r"\.chunk\(",
               r"\.split\(", r"min_8bit_size"),
)
