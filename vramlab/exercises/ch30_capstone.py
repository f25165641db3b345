"""第 30 章 综合调优：把一步训练装进一张放不下它的卡（ch30-capstone）.

Kind "train_step" on a virtual card (settings.learner_budget_mib) that the plain FP32 AdamW step
overflows; the trusted starter runs without the budget and gives the baseline. Host memory is
allowed (offload), and the correctness tolerances are loose enough for bf16 autocast and 8-bit
optimizer states (rtol 2e-2 on the losses, 10% on the update). The judge reports, per memory
category, how much the learner saved against the starter at the peak (settings.report_savings).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, plain_train_step

STARTER = plain_train_step('''最朴素的一步：FP32 权重、FP32 激活值、整批一次前向、torch 的 AdamW（每个参数 8 字节状态）。
在评分用的虚拟显卡上，这一步放不下。''')

SOLUTION = '''\
import torch
import bitsandbytes as bnb


def train_step(model, optimizer, batch, device, micro_batches=4):
    """三招组合，每招对着一类显存：
    - 激活检查点（第 7 章）：每个 block 只留输入，激活值降一个数量级；
    - 梯度累积（第 5 章）：每次只前向 1/4 个 batch，logits 和交叉熵的临时张量也只有 1/4；
    - 8-bit AdamW（第 19 章，bitsandbytes）：优化器状态从每个参数 8 字节降到约 2 字节。"""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not hasattr(model, "_adamw8bit"):            # 第一次调用时创建，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
        model._adamw8bit = bnb.optim.AdamW8bit(model.parameters(), min_8bit_size=0, **hyper)
    opt = model._adamw8bit
    total = 0.0
    for micro in batch.chunk(micro_batches):
        loss = model(input_ids=micro, labels=micro).loss / micro_batches
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch30-capstone",
    chapter=30,
    title="综合调优：从 OOM 到一步训练装进虚拟显卡",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回这一步的损失（Python `float`，整个 batch 的平均）。\n\n"
        "评分器把你的代码放在一张**虚拟显卡**上运行；起始代码（FP32、整批前向、torch AdamW）在这张卡上第一步就 OOM。"
        "请组合本课程学过的技术，让完整的一步装进这张卡：混合精度（第 6 章）、激活检查点（第 7 章）、梯度累积（第 5 章）、"
        "8-bit 优化器（第 19 章，`bitsandbytes.optim.AdamW8bit`）、把优化器状态或激活值卸载到主存（第 19、28 章，"
        "本题允许 `device.host()`、`device.to_host()`、`device.to_device()`、`device.save_on_cpu()`）……\n\n"
        "**损失仍然要对**：损失与起始代码相差不超过 2%，参数更新相差不超过 10%（给 bf16 和 8-bit 状态留了余地）。"
        "评分报告会按显存类别（参数、梯度、优化器状态、激活值、临时张量）列出你比起始代码省了多少，告诉你每种技术各买到了多少显存。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, allow_host=True, learner_budget_mib=110,
                                          report_savings=True, bitsandbytes=True,
                                          config={"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 8192})),
    gpu=Scale(model="gpt2-medium", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(allow_host=True, learner_budget_mib=16384, report_savings=True,
                                           bitsandbytes=True)),
    target_ratio=0.5,
    rtol=2e-2,
    atol=1e-3,
    update_rtol=0.1,
    points=20,
    hints=(
        "先诊断再动手：在笔记本里用 `device.breakdown()` 看起始代码峰值时各类显存各占多少，先打最大的那一类。",
        "激活值：`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})`；"
        "logits 和交叉熵的临时张量：梯度累积，把 batch 切成几份（损失要除以份数）。",
        "优化器状态：`bitsandbytes.optim.AdamW8bit(model.parameters(), min_8bit_size=0, ...)`，第一次调用时创建并存在模型上。",
    ),
)
