"""第 5 章 梯度累积（ch05-accumulation）.

How the target was chosen: see TARGET_NOTE below (measured with `vramlab grade-bench --starters`).
"""
from .spec import ExerciseSpec, Scale, plain_train_step

STARTER = plain_train_step('一次优化器更新：整个 batch 一起前向、反向。结果正确，但激活值随 batch 线性增长。')

SOLUTION = '''\
import torch


def train_step(model, optimizer, batch, device):
    """梯度累积：把 batch 切成 micro-batch，逐个前向、反向，梯度在 .grad 里累加，
    最后只做一次 optimizer.step()。每个 micro-batch 的损失按它占整个 batch 的比例缩放，
    累加出来的梯度就和整个 batch 一起算的完全相同。"""
    micro_batch = 4
    total = 0.0
    n = batch.shape[0]
    for chunk in batch.split(micro_batch):
        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / n)
        loss.backward()
        total += loss.item()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny, batch 16, seq 128; `vramlab grade-bench --starters`): starter 155.0 MiB, solution (micro-batch 4) 93.6 MiB = 0.60x (micro-batch 2: 0.54x). Target 0.75x: the solution passes with 0.15 margin, the starter (1.00x) fails; activation checkpointing alone reaches 0.71x, so the exercise also requires >= 2 model forwards per step (technique=\"accumulation\").")

SPEC = ExerciseSpec(
    id="ch05-accumulation",
    chapter=5,
    title="梯度累积：等效 batch 不变，峰值显存降下来",
    task=(
        "`train_step(model, optimizer, batch, device)` 拿到一整个 batch（形状 `[B, T]` 的 token id，"
        "标签就是它本身），做**一次**参数更新，返回这一步的损失（Python `float`）。\n\n"
        "起始代码把整个 batch 一次性送进模型：前向保存的激活值与 batch 大小成正比，峰值显存很高。\n"
        "请改成**梯度累积**：把 batch 切成若干 micro-batch，逐个前向、反向，梯度在 `.grad` 中累加，"
        "全部做完后只调用一次 `optimizer.step()`。\n\n"
        "要求：\n"
        "1. 等效 batch 不变：更新后的参数要与起始代码一致（在浮点误差范围内）；\n"
        "2. 返回值是整个 batch 的平均损失，与起始代码的返回值一致；\n"
        "3. 稳态峰值显存不超过起始代码的目标比例。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=16, seq=128, steps=2, warmup=1),
    gpu=Scale(model="gpt2-small", batch=16, seq=512, steps=3, warmup=1),
    target_ratio=0.75,
    rtol=1e-4,
    atol=1e-5,
    update_rtol=1e-3,
    technique="accumulation",
    points=10,
    hints=(
        "用 `batch.split(micro_batch)` 或 `batch.chunk(k)` 切分，micro-batch 越小，激活值峰值越低。",
        "每个 micro-batch 的损失要乘以 `chunk.shape[0] / batch.shape[0]` 再 `backward()`，"
        "否则累加的梯度是整个 batch 的 k 倍，参数更新就和起始代码不一样了。",
        "`optimizer.step()` 和 `optimizer.zero_grad(set_to_none=True)` 只在所有 micro-batch 之后各调用一次。",
        "返回值用 `loss.item()` 累加成 Python float；不要把带计算图的张量存进列表，那样激活值会一直活着。",
    ),
)
