"""第 11 章 不让缓存分配器碎掉（ch11-fragmentation）.

Kind "call" (case fragmentation): requests of different lengths (growing from 2048 to 6144 rows in
arrival order: 24 of them at ci scale, 32 on a GPU) arrive in host memory;
`process(requests, weight, device)` returns one result per request, all kept on the device.
Metric: peak reserved minus peak allocated (the caching allocator's waste), and the peak reserved
may not exceed the starter's. `empty_cache()` is refused like everywhere in the grader: it hides the
waste for a moment and costs synchronisations, it does not remove its cause. The hidden case is
another set of lengths in another order (shuffled, the longest above the visible one, fewer rows in
all): a fix fitted to "the lengths only grow" or to the visible longest request fails it. The
simulated cuBLAS workspaces are off at ci scale (they are one fixed block for both codes).
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def process(requests, weight, device):
    """按到达顺序逐个处理请求，结果留在设备上。
    结果是对的，但已保留显存的峰值远远高于已分配显存的峰值。"""
    outputs = []
    for x in requests:
        x = device.to_device(x)
        h = torch.relu(x @ weight)
        outputs.append(h @ weight.T)
    return outputs
'''

LENGTHS = [2048 + (6144 - 2048) * i // 31 for i in range(32)]
CI_LENGTHS = [2048 + (6144 - 2048) * i // 23 for i in range(24)]     # the same range in fewer, larger steps
# 20 lengths evenly from 1536 to 7168 rows, shuffled (random.Random(2)): 87,031 rows against the
# visible 98,293, so the hidden case costs less than the visible one
HIDDEN_LENGTHS = (3610, 3314, 6575, 3907, 7168, 5982, 5389, 1536, 2425, 4203,
                  5685, 2721, 4500, 5093, 6278, 3018, 4796, 6871, 2128, 1832)

TARGET_NOTE = ("Measured on the sim at ci scale (d 256; torch 2.13.0+cpu, 2026-12-02; `vramlab grade "
               "ch11-fragmentation <file>` on the reference and tests/alternatives/ch11-fragmentation/). Visible "
               "(24 requests growing from 2048 to 6144 rows): starter reserved-allocated 230.8 MiB; longest-first "
               "0.12x (argsort, descending: 0.14x), one preallocated hidden-layer buffer sized by the longest "
               "request 0.26x, padding to multiples of 1024 rows 0.34x, processing in reverse arrival order 0.12x, "
               "padding to a hard-coded 6144 rows 0.18x; shortest-first 0.94x, `del x, h` in the loop 0.56x. "
               "Hidden (HIDDEN_LENGTHS): starter 84.5 MiB; longest-first 0.23x (argsort 0.24x), the preallocated "
               "buffer 0.39x, padding to 1024 0.44x (passes, thin), reverse arrival order 0.81x (fails), a "
               "hard-coded 6144-row pad raises. Target 0.50x. With 32 visible requests (before 2026-12-02): "
               "196.9 MiB, 0.09x and 0.24x, a third more work per grading; with 16, padding reached 0.45x.")

SPEC = ExerciseSpec(
    id="ch11-fragmentation",
    chapter=11,
    title="显存碎片：让已保留回到已分配附近",
    task=(
        "`process(requests, weight, device)` 处理一串请求：`requests` 是放在主存里的张量列表"
        "（第 i 个是 `[n_i, d]`，长度各不相同；你看到的配置里，它们按到达顺序逐个变长），"
        "`weight`（`[d, 4d]`）在设备上。对每个请求计算 `relu(x @ weight) @ weight.T`，"
        "结果（`[n_i, d]`）留在设备上，按原顺序返回列表。\n\n"
        "起始代码的结果是对的，**已分配**（allocated）峰值也不过是所有结果加上一个请求的中间结果；"
        "可是**已保留**（reserved）峰值远远高于它：缓存分配器向驱动要来的显存，峰值时有一大块没有被任何张量使用。\n\n"
        "请先诊断这个差值从哪里来：缓存里空着的块是谁留下的，为什么后来的请求用不上它们，又为什么还不回去。"
        "然后改写函数，让 `max_memory_reserved − max_memory_allocated` 降到目标以下，"
        "并且已保留峰值不高于起始代码。评分时还有一组你看不到的请求长度，到达顺序也不同。"
        "`empty_cache()` 不算数（评分器会拒绝）：它把空闲的段还给驱动，让数字一时好看，成因还在。"
    ),
    function="process",
    signature="def process(requests, weight, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=1, seq=1, steps=1, warmup=0,
             settings=call.Settings(case="fragmentation", d_model=256, lengths=CI_LENGTHS, cublas_workspace=False),
             hidden=(Variation(catches="lengths that do not only grow and a longest request above the visible one: "
                                       "processing in reverse arrival order (0.81x) or padding to the visible "
                                       "maximum of 6144 rows (raises) fails",
                               settings={"lengths": HIDDEN_LENGTHS}),)),
    gpu=Scale(model="gpt2-small", batch=1, seq=1, steps=1, warmup=0,
              settings=call.Settings(case="fragmentation", d_model=1024, lengths=LENGTHS)),
    target_ratio=0.5,
    rtol=1e-5,
    points=10,
    kind="call",
    metric="reserved_gap",
    giveaways=(r"sorted\(", r"\.sort\(", r"argsort", r"reversed\(", r"\[::-1\]", r"pad_to_multiple", r"分桶",
               r"先处理最长", r"最长的先"),
    hints=(
        "起始代码处理第 i 个请求时，缓存里空着的块是哪些请求留下的？它们为什么放不下这个请求，又为什么还不回去？"
        "（在模拟设备上，每处理完一个请求打印一次 `device.allocated()` 和 `device.reserved()`，看差值怎样涨。）",
        "每个新请求都比缓存里所有空闲的块大一点，分配器只好再向驱动要一段；旧段又被留在设备上的较小结果切开、钉住，"
        "整段还不回去。如果缓存里从一开始就有足够大的块，后来的请求会怎样？请求一定要按到达顺序处理吗？",
        "先处理最长的请求：`for i in sorted(range(len(requests)), key=lambda i: -requests[i].shape[0])`，"
        "结果放回原来的下标。也可以按最长的请求预先分配中间结果的缓冲区，每个请求都写进它的前 n_i 行（`out=`）。",
    ),
)
