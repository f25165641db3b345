"""第 23 章 在线蒸馏：教师只做推理（ch23-distill）.

Kind "distill_step": the student is the job's model (trained by the grader's AdamW), the teacher a
bigger model of the same family built from settings.teacher_config, both on the device with every
parameter requiring grad (as loaded). The train_step judge applies to the student; the teacher must
come back unchanged. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import distill_step
from .spec import ExerciseSpec, Scale

def _distill_step(doc: str, teacher_forward: str) -> str:
    """Starter and solution differ only in how the teacher runs; the loss is the same code."""
    return f'''import torch
import torch.nn.functional as F


def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):
    """{doc}"""
{teacher_forward}
    out = student(input_ids=batch, labels=batch)
    t = temperature
    vocab = out.logits.shape[-1]
    kd = F.kl_div(F.log_softmax(out.logits.reshape(-1, vocab) / t, dim=-1),
                  F.log_softmax(teacher_logits.reshape(-1, vocab) / t, dim=-1),
                  log_target=True, reduction="batchmean") * t * t
    loss = 0.5 * out.loss + 0.5 * kd
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''


STARTER = _distill_step(
    "逻辑蒸馏（Hinton 2015）的一步：损失 = 0.5 × 交叉熵 + 0.5 × T² × KL(教师 ‖ 学生)。\n"
    "    起始代码让教师也在自动求导下前向：教师的激活值一直留到反向，反向还会给教师算梯度并一直留着。",
    "    teacher_logits = teacher(input_ids=batch).logits")

SOLUTION = _distill_step(
    "教师只做推理：在 no_grad 下前向，不保存激活值、不建计算图，反向也到不了教师，教师不会有梯度。",
    "    teacher.eval()\n    with torch.no_grad():\n        teacher_logits = teacher(input_ids=batch).logits")

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch23-distill",
    chapter=23,
    title="在线蒸馏：教师模型只做推理",
    task=(
        "`distill_step(student, teacher, optimizer, batch, device)` 做一步逻辑蒸馏并返回损失（Python `float`）："
        "损失 = 0.5 × 学生的交叉熵 + 0.5 × T² × KL(教师 ‖ 学生)，温度 T = 2（公式见起始代码）。"
        "`teacher` 比学生大，和刚加载的模型一样所有参数 `requires_grad=True`；`optimizer` 只管学生的参数。\n\n"
        "起始代码让教师在自动求导下前向：教师的激活值被留到反向，反向还会一路算进教师、给教师的每个参数留下梯度。"
        "教师根本不训练，这些显存全是浪费。请让教师**只做推理**，损失和学生的参数更新与起始代码一致，教师的参数保持不变。"
    ),
    function="distill_step",
    signature="def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=64, steps=2, warmup=1,
             settings=distill_step.Settings(
                 cublas_workspace=False,
                 config={"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 4096},
                 teacher_config={"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 4096})),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=distill_step.Settings(config={"n_layer": 6},
                                             teacher_config={"n_layer": 24, "n_embd": 1024, "n_head": 16})),
    target_ratio=0.7,
    points=10,
    kind="distill_step",
    hints=(
        "`with torch.no_grad(): teacher_logits = teacher(input_ids=batch).logits`：教师不建计算图，也不会有梯度。",
        "`teacher.eval()` 关掉教师的 dropout，推理时就该这样。",
        "只有学生的前向需要留激活值给反向。",
    ),
)
