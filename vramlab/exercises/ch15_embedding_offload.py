"""第 15 章 嵌入表留在主存（ch15-embedding-offload）.

Kind "call" (case embedding): the table ([vocab, d], fp32) lives in HOST memory, the ids on the
device; `embed(ids, table, device)` returns the embeddings on the device. Host memory is the point
of this exercise, so `device.host()` / `device.to_host()` are allowed here (settings.allow_host).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def embed(ids, table, device):
    """把嵌入表搬上设备再查表：结果正确，但设备上的峰值显存比一个 batch 的嵌入大得多。"""
    table_on_device = device.to_device(table)
    return table_on_device[ids]
'''

TARGET_NOTE = ("Measured on the sim at ci scale (vocab 50,257 x 256 fp32 = 49.1 MiB on the host, ids 8 x 256; "
               "torch 2.13.0+cpu, 2026-12-02; `vramlab grade ch15-embedding-offload <file>` on the reference and "
               "tests/alternatives/ch15-embedding-offload/): starter 52.02 MiB; gathering on the host 0.039x "
               "(F.embedding on the host the same), unique rows + inverse expanded on the device 0.077x; the table "
               "uploaded in two halves 0.59x. Hidden case (vocab 32,000 x 192, ids 4 x 192): reference 0.023x, "
               "unique rows 0.046x; a result reshaped to the visible (8, 256, 256) raises. Target 0.25x.")

SPEC = ExerciseSpec(
    id="ch15-embedding-offload",
    chapter=15,
    title="嵌入表卸载：表留在主存里",
    task=(
        "`embed(ids, table, device)` 返回 `ids`（`[batch, seq]`，在设备上）对应的嵌入向量"
        "（`[batch, seq, d]`，在设备上），结果与起始代码完全相同。嵌入表 `table`（`[vocab, d]`，FP32）"
        "放在**主存**里。\n\n"
        "起始代码的结果是对的，但它让设备上的峰值显存比一个 batch 的嵌入大得多。请改写它，"
        "把设备峰值降到目标以下；你看不到的配置里词表、宽度、批大小和序列长度都可能不同。\n\n"
        "设备接口：`device.to_device(t)` 把主存里的张量搬上设备，`device.to_host(t)` 把设备上的张量搬回主存。"
        "在模拟设备上，对主存张量做的计算要写在 `with device.host():` 里，否则结果会被记成设备上的分配"
        "（真卡上这一句什么都不做，CPU 张量本来就在主存）。"
    ),
    function="embed",
    signature="def embed(ids, table, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=8, seq=256, steps=1, warmup=0,
             settings=call.Settings(case="embedding", vocab=50257, d_model=256, allow_host=True),
             hidden=(Variation(catches="a result reshaped to the visible (8, 256, 256) or a buffer of that shape; "
                                       "a smaller table and batch, so it costs less",
                               batch=4, seq=192, settings={"vocab": 32000, "d_model": 192}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="embedding", vocab=128256, d_model=4096, allow_host=True)),
    target_ratio=0.25,
    rtol=0.0,
    points=10,
    kind="call",
    metric="peak_allocated",
    giveaways=(r"\btable\s*\[", r"index_select", r"unique\(", r"embedding\(", r"to_host\(\s*ids"),
    hints=(
        "设备上的峰值里最大的是什么？一个 batch 真正用到的只是表里的哪些行？要在主存里挑出这些行，"
        "你手里需要什么，它现在在哪儿？",
        "查表可以在主存那一边做：`ids` 很小，搬回主存几乎不花显存；挑出来的 `[batch, seq, d]` 才是"
        "需要搬上设备的全部。主存上的计算记得写在 `with device.host():` 里。",
        "`ids_host = device.to_host(ids)`，然后在 `with device.host():` 里 `rows = table[ids_host]`，"
        "最后 `device.to_device(rows)`。也可以只搬不重复的行：`torch.unique(ids_host, return_inverse=True)`，"
        "在设备上再按 inverse 展开。",
    ),
)
