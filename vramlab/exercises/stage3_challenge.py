"""高级篇挑战：模型状态占大头的一步训练（stage3-challenge）.

Kind "train_step" on a virtual card (settings.learner_budget_mib) that the plain FP32 AdamW step
overflows. The model is wide and the batch short, so the model states (parameters, gradients,
AdamW's 8 bytes per parameter) are nearly all of the peak. Each optimizer-memory technique of
chapters 16-25 alone (8-bit AdamW, optimizer-state offload, stepping each parameter during
backward) leaves one of those categories whole; two of them together fit. Host memory and
bitsandbytes are allowed; the physical floor is the parameters alone (floor_copies=1: gradients
freed during backward and compressed or offloaded states are legitimate). Tolerances as ch30
(8-bit states).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('''最朴素的一步：FP32 权重、整批一次前向、反向算完全部梯度，再用 torch 的 AdamW（每个参数 8 字节状态）更新。
在评分用的虚拟显卡上，这一步放不下。''')

CI_CONFIG = {"n_layer": 8, "n_embd": 512, "n_head": 8, "vocab_size": 1024, "n_positions": 64}

TARGET_NOTE = ("Measured on the sim at ci scale (python grade_source(spec.id, src, _spec=SPEC), VRAMLAB_GRADE_CORES=1, "
               "2026-12-02; budgets lifted for the single techniques): starter 500.6 MiB (8 layers of 512: 25.8 M "
               "parameters, 16 B each, plus AdamW's foreach temporaries; 1 x 8 tokens). Reference (one AdamW8bit per "
               "parameter, stepped in a post-accumulate-grad hook) 159.9 MiB = 0.319x visible, 0.347x hidden (5 layers "
               "of 448, 7 heads, 1 x 24, 120 MiB card); it still fits cards of 0.9 x 188 and 0.9 x 120 MiB. Host AdamW "
               "+ gradients moved to the host in the hook 109.9 MiB = 0.220x / 0.246x. Each technique alone: state "
               "offload 203.7 MiB (0.407x: passes the target, overflows the 188 MiB card: parameters + all gradients), "
               "8-bit AdamW 253.7 MiB (0.507x), per-parameter torch AdamW stepped in backward 316.5 MiB (0.632x). The "
               "offload-alone / 8-bit-in-backward gap is at most 8 vs 6 B per parameter, hence the deep model and the "
               "card between them. Target 0.5.")

SPEC = ExerciseSpec(
    id="stage3-challenge",
    chapter=25,
    title="高级篇挑战：把模型状态压进一张小卡",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回这一步的损失（Python `float`）。"
        "`optimizer` 是评分器建好的 `torch.optim.AdamW`，超参数从 `optimizer.defaults` 读。\n\n"
        "评分器把你的代码放在一张**虚拟显卡**上运行；起始代码（FP32 权重、反向算完全部梯度、torch 的 AdamW）在这张卡上放不下。"
        "这次的模型很宽，batch 却很短：峰值几乎全是模型状态，也就是参数、梯度和优化器状态，激活值只占零头。"
        "请让完整的一步装进这张卡，而且峰值不超过起始代码（在不限显存时测得）的目标比例。"
        "模型的参数本身必须留在显存里、保持 FP32，参数个数不能变。\n\n"
        "本题考的是高级篇（第 16～25 章）的技术，前两篇的也可以用。本题允许把张量放进主存"
        "（`device.host()`、`device.to_host()`、`device.to_device()`），也可以使用 `bitsandbytes`。"
        "**只用一招放不下**：先算清楚起始代码峰值那一刻每个参数各摊到多少字节、分属哪几类，再看每一招能拿掉其中哪一类。\n\n"
        "**损失仍然要对**：损失与起始代码相差不超过 2%，参数更新相差不超过 10%（给低精度优化器状态留了余地）。"
        "评分报告会按显存类别列出你比起始代码省了多少。隐藏配置的层数、宽度、头数和卡的大小都与你看到的不同，"
        "不要按可见模型的层数或形状写死。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=1, seq=8, steps=2, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, allow_host=True, learner_budget_mib=188,
                                          report_savings=True, bitsandbytes=True, floor_copies=1,
                                          config=CI_CONFIG),
             hidden=(Variation(catches="another depth and width (5 layers of 448, 7 heads) on a smaller card: code "
                                       "that lists the visible 8 blocks or sizes its buckets to width 512 breaks or "
                                       "overflows", seq=24, seed=1,
                               config={"n_layer": 5, "n_embd": 448, "n_head": 7},
                               settings={"learner_budget_mib": 120}),)),
    gpu=Scale(model="gpt2-medium", batch=1, seq=64, steps=3, warmup=1,        # card sized by estimate, not measured
              settings=train_step.Settings(allow_host=True, learner_budget_mib=2600, report_savings=True,
                                           bitsandbytes=True, floor_copies=1)),
    target_ratio=0.5,
    rtol=2e-2,
    atol=1e-3,
    update_rtol=0.1,
    points=20,
    hints=(
        "起始代码峰值那一刻，每个参数在显存里摊到多少字节？其中哪些是参数本身，哪些是梯度，哪些是优化器状态？",
        "优化器状态可以压缩，也可以整份搬到主存；但只要反向结束时全部梯度同时在显存里，参数加梯度就已经超过这张卡。"
        "能不能让某个参数的梯度一算完就被用掉、随即释放，而不是等整个反向结束？",
        "给每个参数一个自己的优化器（第 19 章的“融合到反向”），用 `p.register_post_accumulate_grad_hook(hook)` "
        "在钩子里 `step()` 再 `zero_grad(set_to_none=True)`；优化器用 `bitsandbytes.optim.AdamW8bit([p], min_8bit_size=0, ...)`，"
        "或者在钩子里把梯度 `device.to_host` 到主存、由主存里的 AdamW 更新。优化器只在第一次调用时创建并存在模型上。",
    ),
    giveaways=(r"AdamW8bit", r"register_post_accumulate_grad_hook", r"PagedAdamW", r"min_8bit_size"),
)
