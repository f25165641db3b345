"""进阶篇挑战：激活值占大头的一步训练（stage2-challenge）.

Kind "train_step" on a virtual card (settings.learner_budget_mib) that the plain FP32 step
overflows. The model is deep and narrow with long sequences and only 2 rows per batch, so the
activations saved for backward dominate and gradient accumulation (ch05) can halve them at most.
After activation checkpointing (ch07) the full batch's FP32 logits and cross-entropy temporaries
(vocab 8192) are what is left; chunked cross-entropy (ch15) alone leaves every block's activations.
Together they fit; bf16 autocast (ch06) helps little here. No host memory, no bitsandbytes (those are the next stage's).
Tolerances as ch30, so that bf16 autocast (ch06) stays a legitimate ingredient.
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('''最朴素的一步：FP32 激活值、整批一次前向，反向需要的中间结果全部留在显存里。
在评分用的虚拟显卡上，这一步放不下。''')

CI_CONFIG = {"n_layer": 6, "n_embd": 128, "n_head": 4, "vocab_size": 8192}

TARGET_NOTE = ("Measured on the sim at ci scale (python grade_source(spec.id, src, _spec=SPEC), VRAMLAB_GRADE_CORES=1, "
               "2026-12-02): starter 210.6 MiB (allocated, unlimited card). Reference (HF checkpointing + chunked "
               "cross-entropy of 256 tokens, each chunk checkpointed) 58.9 MiB = 0.280x visible, 0.365x hidden (4 layers, "
               "vocab 6144, 2 x 384, 75 MiB card); manual checkpoint + loss in 4 checkpointed pieces 0.279x / 0.339x. "
               "Each technique alone, peaks without the card: checkpointing 126.4 MiB (0.600x), chunked loss 143.2 MiB "
               "(0.680x), accumulation by rows 125.8 MiB (0.597x), bf16 autocast 190.6 MiB (0.905x); checkpointing + "
               "accumulation 85.2 MiB (0.405x) still overflows the 100 MiB card at step 2 (the reserved pool holds "
               "~23 MiB more than the allocated bytes). The card is what binds: with 80 MiB even the reference "
               "overflowed (fragmentation), hence 100. Target 0.5.")

SPEC = ExerciseSpec(
    id="stage2-challenge",
    chapter=15,
    title="进阶篇挑战：把激活值压进一张小卡",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回这一步的损失（Python `float`，整个 batch 的平均）。\n\n"
        "评分器把你的代码放在一张**虚拟显卡**上运行；起始代码（FP32、整批一次前向、torch 的 AdamW）在这张卡上放不下。"
        "这次的模型又深又窄，序列很长，词表不小，而每个 batch 只有两行：峰值几乎全是前向留给反向的东西。"
        "请让完整的一步装进这张卡，而且峰值不超过起始代码（在不限显存时测得）的目标比例。\n\n"
        "本题考的是进阶篇（第 6～15 章）的技术，也可以用基础篇的；不允许把张量放进主存，也不能用 `bitsandbytes`"
        "（那是高级篇的内容）。**只用一招放不下**：先弄清起始代码的峰值由哪几类显存组成、每一类随什么变大，"
        "再决定组合哪几招。\n\n"
        "**损失仍然要对**：损失与起始代码相差不超过 2%，参数更新相差不超过 10%（给低精度计算留了余地）。"
        "评分报告会按显存类别（参数、梯度、优化器状态、激活值、临时张量）列出你比起始代码省了多少。"
        "隐藏配置的层数、词表、序列长度和卡的大小都与你看到的不同，不要把形状、token 数或切分方式写死。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=2, seq=512, steps=2, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, learner_budget_mib=100, report_savings=True,
                                          config=CI_CONFIG),
             hidden=(Variation(catches="another depth, vocabulary and sequence length on a smaller card: a token count "
                                       "or a chunk plan written for 2 x 512 tokens of a 8192-word vocabulary is wrong "
                                       "there", seq=384, seed=1, config={"n_layer": 4, "vocab_size": 6144},
                               settings={"learner_budget_mib": 75}),)),
    gpu=Scale(model="gpt2-small", batch=2, seq=1024, steps=3, warmup=1,      # card sized by estimate, not measured
              settings=train_step.Settings(learner_budget_mib=3072, report_savings=True)),
    target_ratio=0.5,
    rtol=2e-2,
    atol=1e-3,
    update_rtol=0.1,
    points=20,
    hints=(
        "起始代码的峰值出现在一步中的哪一刻？那一刻的激活值有多少是各层为反向存下的，有多少是最后一层算损失时产生的？",
        "两部分要分别对付：每层存下的中间结果可以不存、反向时重算（第 7 章）；损失那一头，"
        "`[行数 × 序列长度 × 词表]` 的 FP32 张量和它的梯度不必一次全部出现（第 15 章）。只有两行，按行切 batch 帮不了多少。",
        "`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})`；"
        "损失用 `model.transformer(...).last_hidden_state` 和 `model.lm_head.weight` 按几百个 token 一块算 "
        "`F.cross_entropy(..., reduction=\"sum\")`，每块包进 `torch.utils.checkpoint.checkpoint`，最后除以 token 总数。",
    ),
    giveaways=(r"gradient_checkpointing_enable", r"utils\.checkpoint", r"\bcheckpoint\(", r"cross_entropy",
               r"last_hidden_state", r"lm_head"),
)
