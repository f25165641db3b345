"""第 23 章 在线蒸馏：教师只做推理（ch23-distill）.

Kind "distill_step": the student is the job's model (trained by the grader's AdamW), the teacher a
bigger model of the same family built from settings.teacher_config, both on the device with every
parameter requiring grad (as loaded). The train_step judge applies to the student; the teacher must
come back unchanged. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import distill_step
from .spec import ExerciseSpec, Scale, Variation

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
    "逻辑蒸馏（Hinton 2015）的一步：损失 = 0.5 × 交叉熵 + 0.5 × T² × KL(教师 ‖ 学生)。",
    "    teacher_logits = teacher(input_ids=batch).logits")

TARGET_NOTE = ("Measured on the sim at ci scale (student 2 layers d 128, teacher 4 layers d 256, vocab 4096, "
               "batch 4 x 64; torch 2.13.0+cpu, 2026-12-02, grade_source with VRAMLAB_GRADE_CORES=1), visible / hidden: "
               "starter 116.21 MiB; the reference (eval + no_grad) 0.578x / 0.553x; tests/alternatives/ch23-distill: "
               "inference_mode_frozen 0.578x / 0.553x, eval_only 1.00x, no_grad_whole_step exception, fitted_vocab "
               "passes visibly and is incorrect in the hidden case. The hidden case (vocab 2048 for both, teacher "
               "3 layers, seq 48) is cheaper and catches a loss rewritten around the visible vocabulary.")

SPEC = ExerciseSpec(
    id="ch23-distill",
    chapter=23,
    title="在线蒸馏：教师模型只做推理",
    task=(
        "`distill_step(student, teacher, optimizer, batch, device)` 做一步逻辑蒸馏并返回损失（Python `float`）："
        "损失 = 0.5 × 学生的交叉熵 + 0.5 × T² × KL(教师 ‖ 学生)，温度 T = 2（公式见起始代码）。"
        "`teacher` 比学生大，和刚加载的模型一样所有参数 `requires_grad=True`；`optimizer` 只管学生的参数。\n\n"
        "教师在这里只提供软目标，它自己不训练。起始代码却让这一步为教师付出了不少显存。"
        "请找出其中哪些是不必要的，并去掉它们：损失和学生的参数更新与起始代码一致，教师的参数保持不变。"
    ),
    function="distill_step",
    signature="def distill_step(student, teacher, optimizer, batch, device, temperature=2.0):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=64, steps=2, warmup=1,
             settings=distill_step.Settings(
                 cublas_workspace=False,
                 config={"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 4096},
                 teacher_config={"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 4096}),
             hidden=(Variation(catches="a loss rewritten around the visible vocabulary (e.g. reshape(-1, 4096)) or "
                                       "the visible teacher's depth: vocab 2048, a 3-layer teacher, seq 48",
                               seq=48, config={"vocab_size": 2048},
                               settings={"teacher_config": {"n_layer": 3, "n_embd": 256, "n_head": 4,
                                                            "vocab_size": 2048}}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=distill_step.Settings(config={"n_layer": 6},
                                             teacher_config={"n_layer": 24, "n_embd": 1024, "n_head": 16})),
    target_ratio=0.7,
    points=10,
    kind="distill_step",
    hints=(
        "起始代码峰值时，显存里有哪些张量属于教师？反向传播需要其中的哪些？",
        "自动求导会为一次前向记下什么？教师的输出只当作目标使用时，这些记录和教师参数上的梯度还有用吗？",
        "让教师的前向不被自动求导记录，只留下它的 logits；顺便确认教师处在推理模式。",
        "`teacher.eval()`，再 `with torch.no_grad(): teacher_logits = teacher(input_ids=batch).logits`"
        "（`torch.inference_mode()` 也可以）。",
    ),
    giveaways=(r"no_grad", r"inference_mode", r"requires_grad_\(\s*False", r"\.detach\(\)"),
)
