"""第 15 章 嵌入表留在主存（ch15-embedding-offload）.

Kind "call" (case embedding): the table ([vocab, d], fp32) lives in HOST memory, the ids on the
device; `embed(ids, table, device)` returns the embeddings on the device. Host memory is the point
of this exercise, so `device.host()` / `device.to_host()` are allowed here (settings.allow_host).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def embed(ids, table, device):
    """把整张嵌入表搬上设备再查表：结果正确，但 vocab × d 的整张表都占着显存。"""
    table_on_device = device.to_device(table)
    return table_on_device[ids]
'''

SOLUTION = '''\
import torch


def embed(ids, table, device):
    """嵌入表留在主存：把 ids 拿回主机，在主机上查出用到的行，只把这些行搬上设备。"""
    ids_host = device.to_host(ids)
    with device.host():                  # 这次查表发生在主存里（真卡上它本来就在 CPU 上）
        rows = table[ids_host]
    return device.to_device(rows)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (vocab 50,257 x 256 fp32 = 49.1 MiB on the host, ids 8 x 256): "
               "see `vramlab grade-bench --starters`. Target 0.25x.")

SPEC = ExerciseSpec(
    id="ch15-embedding-offload",
    chapter=15,
    title="嵌入表卸载：只把用到的行搬上显卡",
    task=(
        "`embed(ids, table, device)` 返回 `ids`（`[batch, seq]`，在设备上）对应的嵌入向量"
        "（`[batch, seq, d]`，在设备上）。嵌入表 `table`（`[vocab, d]`，FP32）放在**主存**里。\n\n"
        "起始代码用 `device.to_device(table)` 把整张表搬上设备再查表：一个 batch 只用到几千行，"
        "却让 vocab × d 的整张表占着显存。\n\n"
        "请改写它：只把用到的行搬上设备。在模拟设备上，主机上的计算要写在 `with device.host():` 里"
        "（真卡上这一句什么都不做，张量本来就在 CPU 上）；`device.to_host(t)` / `device.to_device(t)` "
        "在两边之间搬数据。结果要与起始代码完全相同。"
    ),
    function="embed",
    signature="def embed(ids, table, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=256, steps=1, warmup=0,
             settings=call.Settings(case="embedding", vocab=50257, d_model=256, allow_host=True)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="embedding", vocab=128256, d_model=4096, allow_host=True)),
    target_ratio=0.25,
    rtol=0.0,
    points=10,
    kind="call",
    metric="peak_allocated",
    hints=(
        "`ids_host = device.to_host(ids)`，然后在 `with device.host():` 里 `rows = table[ids_host]`，"
        "最后 `device.to_device(rows)`。",
        "也可以只搬不重复的行：`torch.unique(ids_host, return_inverse=True)`，在设备上再按 inverse 展开。",
    ),
)
