"""第 21 章 找出并修好一处显存泄漏（ch21-leak）.

Kind "train_step" with settings.learner_budget_mib: the learner's run is on a virtual card that the
leaky starter overflows after a few steps (it keeps every step's logits, B x S x V floats, in a list
on the model); the trusted starter runs without the budget and gives the losses, the update and the
baseline peak. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def train_step(model, optimizer, batch, device):
    """能跑、结果也对的一步。但有人为了“以后排查问题”加了一行记录……
    跑几步以后就会显存溢出（OOM）。找出是哪里在涨，修好它。"""
    out = model(input_ids=batch, labels=batch)
    if not hasattr(model, "debug_history"):
        model.debug_history = []
    model.debug_history.append(out.logits)        # 调试用：保存每一步的输出
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()
'''

SOLUTION = '''\
import torch


def train_step(model, optimizer, batch, device):
    """泄漏在 debug_history：每步的 logits（batch × 序列 × 词表 个 float）都被列表留住，永远不释放。
    只记一个 Python 数（这里记这一步预测对的 token 比例），张量本身随这一步结束而释放。"""
    out = model(input_ids=batch, labels=batch)
    if not hasattr(model, "debug_history"):
        model.debug_history = []
    with torch.no_grad():
        hit = (out.logits[:, :-1].argmax(-1) == batch[:, 1:]).float().mean().item()
    model.debug_history.append(hit)               # 一个 float，不占显存
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.item()
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch21-leak",
    chapter=21,
    title="OOM 排查：找出每一步都在涨的那块显存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码的结果完全正确，但每调用一次，显存就多占一块，再也不释放：评分器在一张**虚拟显卡**上运行你的代码，"
        "起始代码跑不完就会 OOM。请先**诊断**：在笔记本里连续调用几次，每步之后看 `device.allocated()` 怎样增长，"
        "用 `device.top_allocations()` 看最大的几块显存是哪个算子、在哪个模块里分配的；再**修好**它。"
        "调试记录可以保留，但只能留不占显存的东西（比如 Python 数）。损失和参数更新都要与起始代码一致。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=128, steps=5, warmup=1,
             settings=train_step.Settings(cublas_workspace=False, learner_budget_mib=160,
                                          config={"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 8192})),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=5, warmup=1,
              settings=train_step.Settings(learner_budget_mib=9216)),
    target_ratio=0.8,
    points=10,
    hints=(
        "连续调用三次 `train_step`，每次之后打印 `device.allocated()`：稳定的训练每步结束时应该回到同一个数。",
        "`device.top_allocations(at_peak=False)` 列出此刻还活着的最大几块显存，以及分配它们的算子和模块。",
        "一个张量只要还被 Python 对象（列表、字典、模型属性）引用着，就不会释放；`.detach()` 只断开计算图，不释放显存。",
    ),
)
