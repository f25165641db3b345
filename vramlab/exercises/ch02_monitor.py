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
    """草稿：运行 fn，返回运行之后的已分配显存。"""
    fn()
    return device.allocated()
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny + AdamW after one step, batch 8 x seq 128): the three hidden "
               "functions peak at roughly 90-130 MiB absolute; the solution matches the harness's truth exactly "
               "(error 0), the starter is off by >= 10% on every case (it returns the memory after fn) and an "
               "answer that forgets reset_peak() returns the stale 40-60 MiB spike (>= 20% off). Tolerance 1%. "
               "No hidden variation: the three functions are drawn afresh for every grading (kinds/monitor.py). "
               "Issue 15 (`grade_source`, VRAMLAB_GRADE_CORES=1, 2026-12-02; worst error over the three functions, two draws "
               "each): reference 0, memory_stats()['allocated_bytes.all.peak'] after a reset 0, starter 0.38, no reset "
               "0.18-0.22, reset then allocated() 0.37, peak minus the memory before the call 0.71-0.76.")

SPEC = ExerciseSpec(
    id="ch02-monitor",
    chapter=2,
    title="测量峰值显存：不漏掉一闪而过的张量",
    task=(
        "写 `measure_peak(fn, device)`：运行一次 `fn()`（不带参数），返回它运行期间设备上**已分配显存的峰值**"
        "（字节数，整数）。\n\n"
        "这里的峰值是**绝对值**：`fn()` 运行期间任一时刻已分配显存的最高值，包含调用之前已经占用的显存"
        "（模型参数、优化器状态等），不是“比调用前多出来的部分”。\n\n"
        "`device` 是 vramlab 的设备对象，在模拟设备和真 GPU 上有同样的方法，与 `torch.cuda` 的显存统计函数一一对应"
        "（本章“PyTorch 的显存计数器”一节）；起始代码用到的 `device.allocated()` 就是 `torch.cuda.memory_allocated()`。\n\n"
        "评分时用三个隐藏函数检查（每次评分的大小都不同）：一个分配临时张量后全部释放，一个把结果留在显存里，"
        "一个做一步训练。调用之前，设备上可能已经出现过比这三个函数更高的峰值。"
        "你的结果与评分器自己测得的峰值相差不超过 1%，且 `fn` 恰好调用一次。"
    ),
    function="measure_peak",
    signature="def measure_peak(fn, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=8, seq=128, steps=1, warmup=0),
    gpu=Scale(model="gpt2-small", batch=4, seq=512, steps=1, warmup=0),
    target_ratio=0.01,
    kind="monitor",
    points=10,
    giveaways=(r"reset_peak", r"max_allocated", r"max_memory_allocated", r"reset_peak_memory_stats",
               r"allocated_bytes\.all\.peak", r"memory_stats"),
    hints=(
        "fn 运行到一半时分配、返回之前又释放的张量，在 fn 返回之后还能从已分配显存里看到吗？有哪个读数会记住它？",
        "设备会记下一段时间里已分配显存的最高值。这段时间从哪一刻算起？调用 measure_peak 之前留下的更高的峰值，"
        "会不会混进你的读数？",
        "先 `device.reset_peak()`（把峰值重置为当前已分配的量），再调用 `fn()`，最后读 `device.max_allocated()`；"
        "返回绝对值，不要减去调用前的 `allocated()`。真卡上对应 `torch.cuda.reset_peak_memory_stats()` 和 "
        "`torch.cuda.max_memory_allocated()`。",
    ),
)
