"""第 4 章 数据留在主存（ch04-dataloading）.

Kind "train_epoch": the harness creates the dataset as a HOST tensor (under `dev.host()` on the
sim, a CPU tensor on a GPU), resets the peak and calls `train_epoch` once; the peak covers the
whole epoch (the first step's optimizer state included, for both codes). Judged like train_step:
peak ratio against the starter, the same per-batch losses, the same parameter update. A model fed
an input that is not on the device (e.g. a host slice passed straight in) is refused ("tamper").

Why a toy model at ci scale: token ids are 8 bytes each, while a training step keeps hundreds of
bytes of activations per token, so a dataset as large as the training peak takes ~100x more steps
than fit in a CPU test. A 4-wide, 1-layer GPT-2 with an 8-token vocabulary keeps ~600 B/token and
the simulated cuBLAS workspaces (64 MiB, independent of everything) are off, so 48 steps suffice.
"""
from ..grader.kinds import train_epoch
from .spec import ExerciseSpec, Scale, Variation, plain_train_epoch

STARTER = plain_train_epoch('草稿：把数据搬到设备上，再按顺序逐个 batch 训练。')

CI_CONFIG = {"n_layer": 1, "n_embd": 4, "n_head": 1, "vocab_size": 8, "n_positions": 64}
GPU_CONFIG = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 128}

TARGET_NOTE = ("Measured on the sim at ci scale (CI_CONFIG, 24,576 x 16 tokens = 3.0 MiB of int64 on the host, "
               "batch_size 512, 48 steps, cuBLAS workspaces off): see `vramlab grade-bench --starters` "
               "(starter/solution peaks recorded in the report of this change). Target 0.80x. The gpu scale "
               "(GPU_CONFIG, 262,144 x 64 tokens = 128 MiB, batch 256, 1,024 steps) is sized by estimate, "
               "not measured on a GPU. Issue 15 (`grade_source`, VRAMLAB_GRADE_CORES=1, 2026-12-02): starter 7.84 MiB; "
               "reference 4.90 MiB = 0.625x, hidden (batch 320, 15,000 rows: 47 steps, the last one short) 0.632x; "
               "tokens.split() in the loop the same; every batch moved before the loop 1.00x; 48 batches of 512 "
               "rows hard-coded pass the visible case and fail the hidden one (an empty batch raises).")

SPEC = ExerciseSpec(
    id="ch04-dataloading",
    chapter=4,
    title="数据留在主存：显存里只放当前这一批",
    task=(
        "写 `train_epoch(model, optimizer, tokens, device, batch_size)`：用数据集 `tokens`"
        "（形状 `[N, T]` 的 token id，标签就是它本身）按顺序训练一遍：从第 0 行起每 `batch_size` 行一个 batch"
        "（`N` 不一定是 `batch_size` 的倍数，最后一个 batch 可以不满），每个 batch 做一次前向、反向和 "
        "`optimizer.step()`，返回每个 batch 的损失组成的列表（Python `float`）。\n\n"
        "`tokens` 在**主存**（CPU 内存）里，不占显存；模型和优化器在设备上。起始代码的结果是对的，"
        "但整个 epoch 的峰值显存比需要的高。请在结果不变的前提下降低峰值。\n\n"
        "`device` 是 vramlab 的设备对象：`device.to_device(t)` 把主存张量复制到设备上"
        "（在真 GPU 上就是 `.to(\"cuda\")`）。模型的输入必须在设备上：直接把主存里的张量喂给模型，"
        "在 GPU 上会报错，评分器也不接受。\n\n"
        "要求：损失列表与参数更新与起始代码一致，整个 epoch 的峰值显存不超过起始代码的目标比例。"
    ),
    function="train_epoch",
    signature="def train_epoch(model, optimizer, tokens, device, batch_size):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=512, seq=16, steps=1, warmup=0,
             settings=train_epoch.Settings(config=CI_CONFIG, n_samples=24576, cublas_workspace=False),
             hidden=(Variation(catches="another batch size and a dataset that is not a multiple of it (the last "
                                       "batch is short): code that hard-codes 512 rows or 48 batches, or reshapes "
                                       "the dataset into equal batches, breaks",
                               batch=320, settings={"n_samples": 15000}),)),
    gpu=Scale(model="tiny", batch=256, seq=64, steps=1, warmup=0,
              settings=train_epoch.Settings(config=GPU_CONFIG, n_samples=262144)),
    target_ratio=0.80,
    rtol=1e-4,
    atol=1e-5,
    update_rtol=1e-3,
    kind="train_epoch",
    points=10,
    giveaways=(r"to_device\(\s*tokens\s*\[", r"to_device\(\s*(batch|chunk|part|rows|piece)\b",
               r"tokens\.split\("),
    hints=(
        "整个 epoch 里，显存里一直占着什么？模型在某一步真正需要的是其中哪一部分？",
        "对主存里的张量切片，会分配新的内存吗？搬到设备上的是什么、在什么时候搬，才能让设备上同时只有一个 batch？",
        "不要在循环之前搬整个 tokens：在循环里 `batch = device.to_device(tokens[i:i + batch_size])`，"
        "这一步用完，它就随着下一次赋值被释放。",
    ),
)
