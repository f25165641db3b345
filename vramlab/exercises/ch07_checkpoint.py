"""第 7 章 激活检查点（ch07-checkpoint）."""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('普通训练一步：每个 Transformer block 的中间激活值都保存到反向，层数越多占得越多。')

TARGET_NOTE = ("Measured on the sim at ci scale (tiny with 6 layers, batch 8, seq 256): starter 280.3 MiB; "
               "gradient_checkpointing_enable 0.44x (use_reentrant False or True), a hand-written checkpoint wrapper "
               "on every block 0.44x, checkpoint_sequential over the blocks 0.53x (its last segment runs plain), "
               "every other block 0.70x (blocks 0, 2, 4) or 0.74x (blocks 1, 3, 5); bit-identical losses and updates. "
               "Hidden case (4 layers, same batch and seq, seed 1; 2/3 of the visible cost), measured 2026-12-02 with "
               "grade_source per file, VRAMLAB_GRADE_CORES=1: reference 0.54x, every other block 0.74x. Checkpointing "
               "every other block lands at 0.70-0.78x on 4-8 layers, so the target is 0.85x (10% margin: <= 0.765); "
               "what keeps a half fix out is the technique check: recomputation during backward AND block-internal "
               "saved bytes <= 60% of the starter's (checkpointing one block of 6 saves 83%: refused), and gradient "
               "accumulation alone (0.66x) shows no recomputation. fitted_six_blocks (block indices range(6)) passes "
               "visibly and raises in the hidden case. Added 2026-12-05 (steady peaks via vramlab.exercise_setup, "
               "visible / hidden): attn and mlp checkpointed separately in every block 0.48x / 0.56x, "
               "gradient_checkpointing_enable() with its default kwargs 0.47x / 0.58x, the whole model's forward in "
               "one checkpoint 1.00x / 1.00x (its backward recomputes and saves everything at once). The task says "
               "every other block is enough, as the technique check allows.")

SPEC = ExerciseSpec(
    id="ch07-checkpoint",
    chapter=7,
    title="激活检查点：用重算换显存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。"
        "`model` 是 Hugging Face 的 GPT-2（训练模式），它的 Transformer block 在 `model.transformer.h` 里。\n\n"
        "起始代码让每个 block 把所有中间激活值（注意力的 q/k/v、MLP 的 4 倍宽隐藏层……）都留到反向。"
        "请用本章的**激活检查点**以计算换显存：\n\n"
        "1. block 的前向不再为反向保存中间激活值，反向需要时把它们重新算出来。不必每个 block 都这样做"
        "（隔一个做一个也可以，只是省得少一些），但所有 block 为反向保存的字节合计要降到起始代码的 60% 以下："
        "只处理一两个 block 不够；\n"
        "2. 损失、梯度和参数更新与起始代码一致（重算的是同样的计算，结果应当完全相同）；\n"
        "3. 稳态峰值显存不超过起始代码的目标比例。\n\n"
        "怎么量：评分器用同样的模型、同样的数据先跑起始代码，再跑你的函数，比较每一步的损失、训练后参数的变化量，"
        "以及预热一步之后的最大已分配显存；你的代码运行时，它还观察反向过程中 block 里的模块有没有被重新执行，"
        "以及每次从前向进入反向时 block 的前向在设备上留下了多少字节（与起始代码比）。隐藏配置的层数不同，不要把 block 的个数或下标写死。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    # hidden: 4 layers instead of 6 (block indices or a layer count copied from the visible model break),
    # another seed; 2/3 of the visible cost
    ci=Scale(model="tiny", batch=8, seq=256, steps=2, warmup=1, settings=train_step.Settings(config={"n_layer": 6}),
             hidden=(Variation(catches="blocks chosen by indices or a layer count fitted to the 6 visible layers",
                               seed=1, config={"n_layer": 4}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=3, warmup=1),
    target_ratio=0.85,
    rtol=1e-4,
    atol=1e-5,
    update_rtol=1e-3,
    technique="checkpoint",
    points=10,
    hints=(
        "峰值出现在反向开始前后：那时每个 block 为反向留着哪些张量？"
        "如果一个 block 只留下它的输入，反向需要的其余张量从哪里来？",
        "把“一个 block 的前向”当作一个可以在反向时重跑的函数：前向时只记住输入，反向时用同样的输入（和同样的随机数状态）"
        "再算一遍。PyTorch 和 Hugging Face 都有现成的工具（本章“PyTorch 的实现”一节），不必自己写 autograd 函数。",
        "检查点只减少激活值；参数、梯度、优化器状态和 logits 不受影响，所以比例不会低到 0。"
        "只包住少数几个 block 不够：评分器要求 block 内为反向保存的字节不超过起始代码的 60%。",
        "Hugging Face 模型：`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})`；"
        "手写：用 `torch.utils.checkpoint.checkpoint(原来的 forward, *args, use_reentrant=False, **kwargs)` "
        "替换 `model.transformer.h` 里每个 block 的前向。",
    ),
    giveaways=(r"gradient_checkpointing", r"utils\.checkpoint", r"checkpoint\(", r"checkpoint_sequential"),
)
