"""第 13 章 自动找出最大 batch（ch13-max-batch）.

Kind "max_batch": the harness builds the model, takes one step at batch 1 (so the optimizer state
exists), then shrinks the device to a virtual card of `budget_mib`. `find_max_batch(try_step,
device)` may call `try_step(n)`, which runs one full training step at batch n (trusted code) and
raises torch.OutOfMemoryError when it does not fit. The answer must equal the trusted starter's
(a linear search, checked to be one); the number of trials may not exceed
`vramlab.grader.kinds.max_batch.max_trials(answer)` (doubling then bisection needs about 2·log2(answer)).
"""
from ..grader.kinds import max_batch
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch


def find_max_batch(try_step, device):
    """从 1 开始一个一个往上试，直到 OOM：答案是对的，但要试几十次，每次都是一整步训练。"""
    n = 1
    while True:
        try:
            try_step(n + 1)
        except torch.OutOfMemoryError:
            return n
        n += 1
'''

SOLUTION = '''\
import torch


def find_max_batch(try_step, device):
    """先翻倍找到一个放不下的上界，再在“放得下”和“放不下”之间二分。
    OOM 是可以接住的异常：接住之后显存已经释放，进程照常可用。"""
    def fits(n):
        try:
            try_step(n)
            return True
        except torch.OutOfMemoryError:
            return False

    good, bad = 0, 1
    while fits(bad):                  # 1, 2, 4, 8, ... 直到放不下
        good, bad = bad, bad * 2
    while bad - good > 1:             # 不变式：good 放得下（或为 0），bad 放不下
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny with 4 layers, seq 32, an 80 MiB virtual card; "
               "torch 2.13.0+cpu, 2026-12-02): the answer is 21, the starter's linear search takes 21 trials, "
               "doubling then bisection 10 (allowed 12). The card was 128 MiB before: the same lesson with "
               "a third less work per grading. See `vramlab grade-bench --starters`.")

SPEC = ExerciseSpec(
    id="ch13-max-batch",
    chapter=13,
    title="自动 batch 调优：在虚拟显卡上找最大的 batch",
    task=(
        "评分器把设备缩成一块**虚拟显卡**（显存预算比模型需要的大一些，但放不下很大的 batch），"
        "然后调用 `find_max_batch(try_step, device)`。`try_step(n)` 用 batch n 完整地训练一步"
        "（前向、反向、优化器更新）；放不下时抛出 `torch.OutOfMemoryError`，而且显存会被释放，进程可以继续用。\n\n"
        "请返回**能放下的最大 batch**：n 放得下、n + 1 放不下（评分器在你返回后会亲自复查）。\n\n"
        "起始代码从 1 开始逐个往上试，答案对，但每试一次就是一整步训练，太慢。"
        "请用“先翻倍找上界、再二分”的办法，把试探次数降到约 2·log₂(答案) 次以内。"
    ),
    function="find_max_batch",
    signature="def find_max_batch(try_step, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=1, seq=32, steps=1, warmup=0,
             settings=max_batch.Settings(budget_mib=80, max_batch_allowed=4096, config={"n_layer": 4},
                                         cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=1, seq=1024, steps=1, warmup=0,
              settings=max_batch.Settings(budget_mib=16 * 1024, max_batch_allowed=4096)),
    target_ratio=1.0,
    points=10,
    kind="max_batch",
    metric="trials",
    hints=(
        "`try: try_step(n) except torch.OutOfMemoryError: ...`：OOM 可以接住，接住之后照常继续。",
        "先 1、2、4、8……翻倍，直到放不下；再在最后一个放得下的和第一个放不下的之间二分。",
        "二分的终点：放得下的 good 和放不下的 bad 相差 1，返回 good。",
    ),
)
