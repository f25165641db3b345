"""第 20 章 逐参数通信与更新：梯度一算好就 AllReduce、就更新、就释放（ch20-overlap）.

Kind "train_step" on 2 gloo processes (data parallel), the contract of ch08: every rank's losses and
parameter update are judged against the same rank of the trusted starter, and the worst rank's
steady peak. The starter is ch08's solution (in-place AllReduce after backward, then one
optimizer.step): every gradient is alive at the end of backward, and AdamW's foreach temporaries
come on top. cuBLAS workspaces are off at ci scale (a fixed 64 MiB would hide the difference).
"""
from .ch08_allreduce import averaged_train_step
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation

STARTER = averaged_train_step("""数据并行的一步：反向全部结束以后，逐个参数原地 AllReduce、求平均，再统一更新。""")

TARGET_NOTE = ("Measured on the sim at ci scale (6-layer tiny, d 256, vocab 1024, global batch 2 x 64, 2 ranks; "
               "torch 2.13.0+cpu, 2026-12-02, grade_source with VRAMLAB_GRADE_CORES=1), visible / hidden: starter "
               "97.89 MiB; the reference 0.749x / 0.702x; tests/alternatives/ch20-overlap: per_index_hooks_prescaled "
               "0.749x / HIDDEN_PI; reduce_in_hook_step_after (overlap without freeing) 1.00x; fitted_visible_shape "
               "0.749x visibly, 1.00x hidden. A hidden case of 4 layers x global batch 4 x 32 left the reference at "
               "0.763x (thin against 0.765). The hidden case (5 layers, sequences of 32, seed 1) is "
               "cheaper and catches code that branches on the visible shapes.")

SPEC = ExerciseSpec(
    id="ch20-overlap",
    chapter=20,
    title="逐参数通信与更新：梯度算好就 AllReduce、就更新、就释放",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一部分。\n\n"
        "`train_step(model, optimizer, batch, device)` 做一步数据并行训练（梯度在所有 rank 之间求平均，"
        "AdamW 更新），返回本 rank 的损失（Python `float`）。\n\n"
        "起始代码等反向**全部结束**才通信、才更新：反向结束时整份梯度同时活着，"
        "优化器更新时还有自己的临时张量。请改成**每个梯度一算好就通信、就用上、就释放**，"
        "让整份梯度从不同时存在。每个 rank 的损失和参数更新都要与起始代码一致（AdamW 的超参数以评分器的优化器为准）；"
        "评分看各 rank 稳态峰值中最大的那个。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=2, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False, floor_copies=3,
                                          config={"n_layer": 6, "n_embd": 256, "n_head": 4, "vocab_size": 1024}),
             hidden=(Variation(catches="code that takes the per-gradient path only for the visible shapes "
                                       "(or sizes something by the visible depth): 5 layers, sequences of 32",
                               seq=32, seed=1, config={"n_layer": 5}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=train_step.Settings(world_size=2, floor_copies=3)),
    target_ratio=0.85,
    points=10,
    hints=(
        "反向进行到一半时，哪些参数的梯度已经是最终值了？要等到反向全部结束，才能对它们做点什么吗？",
        "如果一个梯度在反向中途就通信完、用完，它还需要留到反向结束吗？那么这个参数的更新能不能单独做，"
        "而结果和一个优化器统一更新完全一样？",
        "在每个参数上挂一个“梯度累加完毕”时触发的钩子（只挂一次，存在模型的属性上）：在钩子里求平均、"
        "用这个参数自己的 AdamW（超参数与评分器的优化器相同）更新、释放梯度。",
        "`p.register_post_accumulate_grad_hook(hook)`；钩子里 `dist.all_reduce(p.grad)`、`p.grad /= 世界大小`、"
        "`per_param[p].step()`、`p.grad = None`；`per_param = {p: torch.optim.AdamW([p], lr=..., betas=..., eps=..., "
        "weight_decay=...)}`。",
    ),
    giveaways=(r"register_post_accumulate_grad_hook", r"AdamW\(\s*\[\s*p\s*\]", r"\.grad\s*=\s*None",
               r"register_hook"),
)
