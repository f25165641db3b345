"""第 2 章 测量峰值显存（ch02-monitor）.

Kind "monitor": the harness builds the model (AdamW, one warm-up step so the optimizer state
exists) and three hidden functions whose sizes are drawn from a seed the parent picks afresh for
every grading: one that allocates and frees before returning, one that leaves its output
allocated, one training step. For each it measures the truth itself (reset the peak with the
captured original, run, read the peak), then leaves a stale, higher peak behind (a freed 40-60 MiB
tensor) and asks the learner's `measure_peak(fn, device)`.
"""
from .spec import ExerciseSpec, Scale

STARTER = '''\
def measure_peak(fn, device):
    """运行 fn，返回运行之后的已分配显存。看起来合理，但 fn 里用完就释放的临时张量
    （激活值、中间结果）在返回时已经不在了：这测的是“之后”，不是“峰值”。"""
    fn()
    return device.allocated()
'''

SOLUTION = '''\
def measure_peak(fn, device):
    """峰值计数器会一直记着历史最高值：先把它重置为当前已分配的量，再运行 fn，
    最后读出这段时间里的最高值（绝对值，包含调用前已经占用的显存）。"""
    device.reset_peak()
    fn()
    return device.max_allocated()
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny + AdamW after one step, batch 8 x seq 128): the three hidden "
               "functions peak at roughly 90-130 MiB absolute; the solution matches the harness's truth exactly "
               "(error 0), the starter is off by >= 10% on every case (it returns the memory after fn) and an "
               "answer that forgets reset_peak() returns the stale 40-60 MiB spike (>= 20% off). Tolerance 1%.")

SPEC = ExerciseSpec(
    id="ch02-monitor",
    chapter=2,
    title="测量峰值显存：reset_peak 与 max_allocated",
    task=(
        "写 `measure_peak(fn, device)`：运行一次 `fn()`（不带参数），返回它运行期间设备上**已分配显存的峰值**"
        "（字节数，整数）。\n\n"
        "这里的峰值是**绝对值**：`device.max_allocated()` 的读数，包含调用之前已经占用的显存"
        "（模型参数、优化器状态等），不是“比调用前多出来的部分”。\n\n"
        "`device` 在模拟设备和真 GPU 上有同样的方法：`allocated()`（当前已分配）、`max_allocated()`（峰值）、"
        "`reset_peak()`（把峰值重置为当前已分配的量），分别对应 `torch.cuda.memory_allocated()`、"
        "`torch.cuda.max_memory_allocated()` 和 `torch.cuda.reset_peak_memory_stats()`。\n\n"
        "评分时用三个隐藏函数检查（每次评分的大小都不同）：一个分配临时张量后全部释放，一个把结果留在显存里，"
        "一个做一步训练。调用之前，峰值计数器里可能留着更早的、更高的峰值。"
        "你的结果与评分器自己测得的峰值相差不超过 1%，且 `fn` 恰好调用一次。"
    ),
    function="measure_peak",
    signature="def measure_peak(fn, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=128, steps=1, warmup=0),
    gpu=Scale(model="gpt2-small", batch=4, seq=512, steps=1, warmup=0),
    target_ratio=0.01,
    kind="monitor",
    points=10,
    hints=(
        "只看 fn() 之后的 allocated()，会错过 fn 运行中途出现又被释放的张量。",
        "峰值计数器记着历史最高值：先 device.reset_peak()，再运行 fn()，最后读 device.max_allocated()。",
        "返回绝对值，不要减去调用前的 allocated()。",
    ),
)
