"""第 12 章 评估循环不留计算图（ch12-eval-loop).

Kind "call" (case eval_loop): the harness builds the model and `n_batches` batches on the device,
resets the peak and calls `evaluate(model, batches, device)` once; judged on the returned mean loss
(against the starter's) and the peak (against the starter's), and the model must come out unchanged.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def evaluate(model, batches, device):
    """逐个 batch 算损失再求平均。结果是对的，但 total 是一个带计算图的张量：
    每个 batch 的整张计算图（连同为反向保存的激活值）都挂在它身上，直到函数返回。"""
    total = 0
    for batch in batches:
        loss = model(input_ids=batch, labels=batch).loss
        total = total + loss
    return (total / len(batches)).item()
'''

SOLUTION = '''\
import torch


def evaluate(model, batches, device):
    """评估不需要反向：inference_mode 下不建计算图、不保存激活值；
    每个 batch 的损失立刻变成 Python float，张量随即释放。"""
    total = 0.0
    with torch.inference_mode():
        for batch in batches:
            total += model(input_ids=batch, labels=batch).loss.item()
    return total / len(batches)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny with 4 layers, 4 batches of 8 x 128): see "
               "`vramlab grade-bench --starters`. Target 0.50x.")

SPEC = ExerciseSpec(
    id="ch12-eval-loop",
    chapter=12,
    title="评估循环：不要把计算图带出循环",
    task=(
        "`evaluate(model, batches, device)` 在 `batches`（已经在设备上的若干个 batch）上计算模型的平均损失，"
        "返回 Python `float`。\n\n"
        "起始代码的结果是对的，但它把每个 batch 的损失张量累加进 `total`：`total` 带着计算图，"
        "所有 batch 为反向保存的激活值都无法释放，显存随 batch 数线性增长。\n\n"
        "请改写它：评估不需要梯度（`torch.no_grad()` 或 `torch.inference_mode()`），"
        "损失及时变成 Python 数（`.item()`）。不要修改模型参数。"
    ),
    function="evaluate",
    signature="def evaluate(model, batches, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="eval_loop", n_batches=4, config={"n_layer": 4})),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="eval_loop", n_batches=8)),
    target_ratio=0.5,
    rtol=1e-5,
    points=10,
    kind="call",
    metric="peak_allocated",
    hints=(
        "把循环放进 `with torch.inference_mode():`（或 `torch.no_grad()`）：前向就不会为反向保存激活值。",
        "累加 `loss.item()`（Python float），不要累加损失张量本身。",
    ),
)
