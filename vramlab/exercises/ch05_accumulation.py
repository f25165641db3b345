"""第 5 章 梯度累积（ch05-accumulation）.

How the target was chosen: see TARGET_NOTE below.
"""
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('一次优化器更新：整个 batch 一起前向、反向。结果正确，但激活值随 batch 线性增长。')

TARGET_NOTE = ("Measured on the sim at ci scale (tiny, batch 16, seq 128, cuBLAS workspaces on; steady peaks with "
               "vramlab.exercise_setup(id, _hidden=i), 2026-12-05; verdicts with `vramlab grade` per file): starter 155.0 "
               "MiB visible, 172.4 MiB hidden (19 rows, seed 2); about 73 MiB fixed (weights, AdamW, two 32 MiB cuBLAS "
               "workspaces) plus 5.1 MiB per row of a micro-batch. Solution (micro-batch 2) 0.54x visible / 0.48x hidden; "
               "batch.chunk(4) weighted by rows 0.60x / 0.57x; micro-batches of 5 with the outputs kept 0.65x / 0.59x; "
               "two halves (8 / 10 rows) ~0.74x / ~0.73x: inside the target, not the 10% margin, in both cases. Target "
               "0.75x; activation checkpointing alone reaches 0.71x, so the exercise also requires >= 2 forward->backward "
               "passes per step through the blocks, none with more than 75% of the batch's tokens "
               "(technique=\"accumulation\"). The hidden batch is 19 rows, a prime above 16: every chunking "
               "leaves an uneven last chunk there (chunk(4): 5, 5, 5, 4; split(2): ..., 1; split(4): 4 x 4 + 3), so a "
               "loss divided by the chunk count is wrong, and a fixed-size micro-batch peaks no higher than visibly, so "
               "an honest chunking keeps its margin; 12 rows, the old hidden batch, let chunk(4) / 4 pass.")

SPEC = ExerciseSpec(
    id="ch05-accumulation",
    chapter=5,
    title="梯度累积：等效 batch 不变，峰值显存降下来",
    task=(
        "`train_step(model, optimizer, batch, device)` 拿到一整个 batch（形状 `[B, T]` 的 token id，"
        "标签就是它本身），做**一次**参数更新，返回这一步的损失（Python `float`）。\n\n"
        "起始代码把整个 batch 一次性送进模型，结果正确，但峰值显存太高。请用本章的**梯度累积**把峰值降下来，"
        "同时保持这一步在数学上不变：\n\n"
        "1. 每次调用仍然只做一次参数更新，更新后的参数与整个 batch 一起算的相同（在浮点误差范围内）；\n"
        "2. 返回值是整个 batch 的平均损失，与起始代码的返回值一致；\n"
        "3. 稳态峰值显存不超过起始代码的目标比例。\n\n"
        "怎么量：评分器用同样的模型、同样的数据先跑起始代码，再跑你的函数，比较每一步返回的损失、"
        "训练后参数的变化量，以及预热一步之后的最大已分配显存。批大小 `B` 不是固定的："
        "隐藏配置里的 `B` 不一定能被你选的切分方式整除，代码要对任何 `B ≥ 2` 都给出同样的更新。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    # hidden: 19 rows, a prime: no chunking divides it, so a loss divided by the number of chunks (or
    # by 4, fitted to 16 rows), or a reshape to 16, fails; more rows than visibly, so an honest
    # micro-batch peaks at a smaller share of the starter's there (see TARGET_NOTE)
    ci=Scale(model="tiny", batch=16, seq=128, steps=2, warmup=1,
             hidden=(Variation(catches="a loss divided by the number of chunks (right only when the chunks are "
                                       "equal: B = 16 split in 4), or a view(4, 4, T)",
                               batch=19, seed=2),)),
    gpu=Scale(model="gpt2-small", batch=16, seq=512, steps=3, warmup=1),
    target_ratio=0.75,
    rtol=1e-4,
    atol=1e-5,
    update_rtol=1e-3,
    technique="accumulation",
    points=10,
    hints=(
        "激活值的大小和一次前向里的样本数成正比。如果一次只让一部分样本经过模型，"
        "怎样才能让几次反向留在 `.grad` 里的梯度，加起来正好等于整批平均损失的梯度？",
        "整批平均损失 = 各部分平均损失按“这一部分的样本数 ÷ 整批样本数”加权求和；梯度也按同样的权重相加。"
        "注意最后一部分可能比别的小，而且参数更新只能在所有部分都反向之后做一次。",
        "返回值用 Python 数累加，不要把带计算图的张量留在列表里：那样每一部分的激活值都一直活着。",
        "写法：`for chunk in batch.split(micro_batch):` 里 `loss = model(input_ids=chunk, labels=chunk).loss "
        "* (chunk.shape[0] / batch.shape[0])`、`loss.backward()`、`total += loss.item()`；循环结束后各调用一次 "
        "`optimizer.step()` 和 `optimizer.zero_grad(set_to_none=True)`。",
    ),
    giveaways=(r"\.split\(", r"\.chunk\(", r"tensor_split", r"shape\[0\]\s*/"),
)
