"""第 12 章 评估循环的显存（ch12-eval-loop).

Kind "call" (case eval_loop): the harness builds the model and `n_batches` batches on the device,
resets the peak and calls `evaluate(model, batches, device)` once; judged on the returned mean loss
(against the starter's) and the peak (against the starter's), and the model must come out unchanged.
The starter keeps every batch's loss tensor in a list (the chapter's example adds them up instead).
The simulated cuBLAS workspace (32 MiB, the same for both codes) is off at ci scale: it would hide
the difference between keeping no activations and keeping one batch's.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def evaluate(model, batches, device):
    """每个 batch 算一个损失，最后对所有 batch 求平均。
    结果是对的，但峰值显存随 batch 数增长。"""
    losses = []
    for batch in batches:
        out = model(input_ids=batch, labels=batch)
        losses.append(out.loss)
    return torch.stack(losses).mean().item()
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny with 4 layers, 4 batches of 8 x 128, cuBLAS workspace off; "
               "torch 2.13.0+cpu, 2026-12-02, `vramlab grade ch12-eval-loop <file>` on the reference and "
               "tests/alternatives/ch12-eval-loop/): starter 264.4 MiB; inference_mode + .item() 0.054x (hidden "
               "case: 0.094x), no_grad keeping the loss tensors and inference_mode in a decorated helper the same; "
               ".item() without turning autograd off, the half fix, 0.27x (hidden 0.35x: one batch's saved "
               "activations at a time); no_grad around the final mean only 0.98x. Target 0.15x: the half fix fails "
               "both cases, the reference is 64% (visible) and 37% (hidden) inside it. With the 32 MiB workspace "
               "on (before 2026-12-02, a += starter) the reference was 0.16x and the half fix 0.35x: too close for "
               "one target. GPU scale not measured (no GPU in this session); by arithmetic from "
               "vramlab/data/h200_gpt2_peaks.md (gpt2-small, 8 x 1024: training peak 14,320 MiB less ~1.9 GiB of model "
               "states, so ~12 GiB kept per batch with autograd on; inference 1,339 MiB at 8 x 512, so ~2 GiB) the reference is ~0.05x and the half fix ~0.3x with 4 batches, while with "
               "8 batches the half fix would sit near 0.15x: hence 4.")

SPEC = ExerciseSpec(
    id="ch12-eval-loop",
    chapter=12,
    title="评估循环：显存为什么随 batch 数增长",
    task=(
        "`evaluate(model, batches, device)` 在 `batches`（已经在设备上的若干个 batch）上计算模型的平均损失，"
        "返回 Python `float`。评分器只调用它一次：之后既不做反向传播，也不训练。\n\n"
        "起始代码算出的数是对的，但它的峰值显存随 batch 数增长，远远超过模型本身加上**一个** batch 的前向"
        "所需要的量。请先弄清楚：峰值出现时，显存里是哪些张量、为什么它们还没有被释放；再改写函数，"
        "把峰值降到目标以下。返回值要与起始代码一致，不能修改模型参数。"
    ),
    function="evaluate",
    signature="def evaluate(model, batches, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=8, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="eval_loop", n_batches=4, config={"n_layer": 4}, cublas_workspace=False),
             hidden=(Variation(catches="a mean taken over a hard-coded 4 batches, or a loop over the visible "
                                       "count; fewer layers and a shorter sequence",
                               seq=96, config={"n_layer": 3}, settings={"n_batches": 3}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="eval_loop", n_batches=4)),
    target_ratio=0.15,
    rtol=1e-5,
    points=10,
    kind="call",
    metric="peak_allocated",
    giveaways=(r"inference_mode", r"no_grad", r"set_grad_enabled", r"requires_grad_\(\s*False", r"\.detach\("),
    hints=(
        "峰值出现在最后一个 batch 的前向里。这时前面每个 batch 的前向留下的张量还活着吗？是谁引用着它们？",
        "`losses` 里存的每个损失张量都连着它那个 batch 的整个前向：自动求导为反向保存的激活值都挂在上面。"
        "只存 Python 数可以让前一个 batch 的这些张量及时释放；可是评估根本不做反向，"
        "每个 batch 的前向本身还需要保存这些激活值吗？",
        "把循环放进 `with torch.inference_mode():`（或 `torch.no_grad()`），前向就不再建图、不保存激活值；"
        "再把每个损失 `.item()` 成 Python 数累加。",
    ),
)
