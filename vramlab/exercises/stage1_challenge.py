"""基础篇挑战：数据集和一步训练都太大（stage1-challenge）.

Kind "train_epoch": one pass over a dataset that lives in host memory (ch04), judged on the same
losses and parameter updates as the starter and on the peak over the whole epoch. The starter
copies the whole dataset to the device and trains each batch in one forward: the dataset and one
step's activations are about the same size, so streaming the batches (ch04) alone or gradient
accumulation (ch05) alone leaves the other half; together they pass. A 4 MiB virtual card
(learner_budget_mib) refuses each technique alone at once; see TARGET_NOTE.
"""
from ..grader.kinds import train_epoch
from .spec import ExerciseSpec, Scale, Variation, plain_train_epoch

STARTER = plain_train_epoch('''最直接的写法：先把整个数据集搬到设备上，再按顺序每 batch_size 行做一次前向、反向和更新。
结果正确，但显存远超目标。''')

CI_CONFIG = {"n_layer": 1, "n_embd": 4, "n_head": 1, "vocab_size": 8, "n_positions": 128}

TARGET_NOTE = ("Measured on the sim at ci scale (python grade_source(spec.id, src, _spec=SPEC), VRAMLAB_GRADE_CORES=1, "
               "2026-12-02): starter 13.6 MiB (4096 x 128 int64 tokens = 4 MiB on the device, plus one 128-row "
               "step, ~9.6 MiB). Reference (batches streamed, micro-batches of 32 rows) 0.188x visible, 0.259x hidden "
               "(batch 96, 2600 rows: 28 batches, the last one short, seed 1); pinned_rows_budget (up to 24 rows moved "
               "at a time) 0.137x / 0.191x. Target 0.35x: streaming alone can never reach it (one full step is ~70% "
               "of the starter). Accumulation alone with tiny micro-batches could, by the ratio (dataset 4 MiB + "
               "8 rows ~0.34x): the virtual card is what refuses it. Virtual card (settings.learner_budget_mib, the "
               "learner's run only) 4 MiB: the dataset alone fills it, one full step overflows it, so each technique "
               "alone runs out of memory at once (0.1 s, visible and hidden), while the reference (2.6 MiB) and "
               "pinned_rows_budget fit. The dataset's bytes fall in no category of the savings report (it lists "
               "activations and temporaries only). Sized for the class's grading time (issue 14): 32 + 28 steps of "
               "4 / 3 forwards, half the forwards of the first version (8192 and 5000 rows, 12.6 s on a quiet "
               "2-core machine, the slowest exercise by far).")

SPEC = ExerciseSpec(
    id="stage1-challenge",
    chapter=5,
    title="基础篇挑战：数据集和一步训练都放不下",
    task=(
        "`train_epoch(model, optimizer, tokens, device, batch_size)` 在整个数据集上训练一遍：`tokens` 是放在**主存**里的 "
        "`[样本数, 序列长度]` 整数张量，按顺序每 `batch_size` 行做**一次**参数更新（最后一批可能不满），"
        "返回每次更新的损失（Python `float` 的列表，每个是那一批的平均损失）。\n\n"
        "评分器让你的代码在一张**虚拟显卡**上跑完整个 epoch；起始代码结果正确，但在这张卡上放不下，峰值也远超目标。"
        "这次有两样东西同样大：一样随数据集的行数变大，"
        "另一样随一次前向的行数变大，**只对付其中一样达不到目标**。请用基础篇（第 1～5 章）的技术让峰值降到起始代码的目标比例以下，"
        "每批仍只更新一次，损失和参数更新要与起始代码一致。\n\n"
        "评分报告会按显存类别列出你比起始代码省了多少。隐藏配置的批大小和样本数都不同（样本数不是批大小的整数倍），"
        "不要把行数、批数或切分的形状写死。"
    ),
    function="train_epoch",
    signature="def train_epoch(model, optimizer, tokens, device, batch_size):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=128, seq=128, steps=1, warmup=0,
             settings=train_epoch.Settings(config=CI_CONFIG, n_samples=4096, cublas_workspace=False,
                                           report_savings=True, learner_budget_mib=4),
             hidden=(Variation(catches="another batch size and a dataset that is not a multiple of it (the last batch "
                                       "is short): micro-batches cut with view(4, 32, 16), a loss divided by a fixed "
                                       "count or 64 batches written in break", batch=96, seed=1,
                               settings={"n_samples": 2600}),)),
    gpu=Scale(model="tiny", batch=256, seq=64, steps=1, warmup=0,
              settings=train_epoch.Settings(config={"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256,
                                                    "n_positions": 128}, n_samples=262144, report_savings=True)),
    target_ratio=0.35,
    rtol=1e-4,
    atol=1e-5,
    update_rtol=1e-3,
    kind="train_epoch",
    points=20,
    hints=(
        "起始代码的峰值里有哪两大块？哪一块从 epoch 开始一直占到结束，哪一块每一步都重新长出来、又随什么变大？",
        "数据集本来在主存里：设备上每一刻真正需要的只是正在算的那几行（第 4 章）。"
        "一批的梯度也不必由一次前向算出来：分几次前向、反向，梯度会在 `.grad` 里累加（第 5 章），损失要按行数加权。",
        "循环里 `batch = device.to_device(tokens[i:i + batch_size])`，不要在循环前搬整个 `tokens`；"
        "再 `for micro in batch.split(k)`：`loss = model(...).loss * (micro.shape[0] / batch.shape[0])`、`loss.backward()`，"
        "一批结束后 `optimizer.step()`、`optimizer.zero_grad(set_to_none=True)`。",
    ),
    giveaways=(r"to_device\(\s*tokens\s*\[", r"\.split\(", r"\.chunk\(", r"tensor_split"),
)
