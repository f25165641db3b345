"""第 11 章 不让缓存分配器碎掉（ch11-fragmentation）.

Kind "call" (case fragmentation): requests whose lengths grow from 2048 to 6144 rows (24 of them
at ci scale, 32 on a GPU) arrive in host memory; `process(requests, weight, device)` returns one
result per request, all kept on the device. Metric: peak reserved minus peak allocated (the
caching allocator's waste), and the peak reserved may not exceed the starter's. `empty_cache()`
is refused like everywhere in the grader: it hides the waste for a moment and costs
synchronisations, it does not remove its cause. The simulated cuBLAS workspaces are off at ci scale (they are one fixed block for both codes).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def process(requests, weight, device):
    """按到达顺序处理请求：每个请求比上一个稍长，缓存里空出来的块总是差一点放不下，
    分配器只好不断申请新的段；留在设备上的结果又把旧段钉住，已保留显存越涨越高。"""
    outputs = []
    for x in requests:
        x = device.to_device(x)
        h = torch.relu(x @ weight)
        outputs.append(h @ weight.T)
    return outputs
'''

SOLUTION = '''\
import torch


def process(requests, weight, device):
    """先处理最长的请求：第一次就申请到最大的块，之后更短的请求都能在缓存里复用它们。
    结果按原来的顺序放回列表。"""
    outputs = [None] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: -requests[i].shape[0]):
        x = device.to_device(requests[i])
        h = torch.relu(x @ weight)
        outputs[i] = h @ weight.T
    return outputs
'''

LENGTHS = [2048 + (6144 - 2048) * i // 31 for i in range(32)]
CI_LENGTHS = [2048 + (6144 - 2048) * i // 23 for i in range(24)]     # the same range in fewer, larger steps

TARGET_NOTE = ("Measured on the sim at ci scale (d 256, 24 requests of 2048..6144 rows; torch 2.13.0+cpu, "
               "2026-12-02): starter reserved-allocated 230.8 MiB, longest-first 27.3 MiB (0.12x), padding to "
               "multiples of 1024 rows 68.4 MiB (0.30x). Target 0.50x. With 32 requests (before 2026-12-02): "
               "196.9 MiB, 0.09x and 0.24x, a third more work per grading; with 16, padding reached 0.45x.")

SPEC = ExerciseSpec(
    id="ch11-fragmentation",
    chapter=11,
    title="显存碎片：让已保留回到已分配附近",
    task=(
        "`process(requests, weight, device)` 处理一串请求：`requests` 是放在主存里的张量列表"
        "（第 i 个是 `[n_i, d]`，长度逐个增长），`weight`（`[d, 4d]`）在设备上。对每个请求计算 "
        "`relu(x @ weight) @ weight.T`，结果（`[n_i, d]`）留在设备上，按原顺序返回列表。\n\n"
        "起始代码的结果是对的，但按到达顺序处理时，每个请求都比缓存里空出来的块稍大一点，"
        "缓存分配器只好一次次申请新的段；留在设备上的结果又把旧段钉住。"
        "最后**已保留**（reserved）显存远远高于**已分配**（allocated）的峰值。\n\n"
        "请改写它，让 `max_memory_reserved − max_memory_allocated` 降到起始代码的目标比例以下，"
        "并且已保留峰值不高于起始代码。可以换处理顺序、把长度补齐到少数几个桶、预先分配……"
        "但不能调用 `empty_cache()`（评分器会拒绝：它只是把问题藏起来）。"
    ),
    function="process",
    signature="def process(requests, weight, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=1, seq=1, steps=1, warmup=0,
             settings=call.Settings(case="fragmentation", d_model=256, lengths=CI_LENGTHS, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=1, seq=1, steps=1, warmup=0,
              settings=call.Settings(case="fragmentation", d_model=1024, lengths=LENGTHS)),
    target_ratio=0.5,
    rtol=1e-5,
    points=10,
    kind="call",
    metric="reserved_gap",
    hints=(
        "先处理最长的请求（记住原来的下标，最后按原顺序返回）：最大的块第一次就申请好，后面都能复用。",
        "或者把长度补齐到少数几个桶（比如 1024 的倍数），形状种类少了，缓存里的块就能反复用上；"
        "补齐后记得只取前 n_i 行并 `.clone()`，别让视图钉住整块大张量。",
        "`empty_cache()` 不算数：它把缓存还给驱动，下一次申请又要重新向驱动要，碎片的成因还在。",
    ),
)
