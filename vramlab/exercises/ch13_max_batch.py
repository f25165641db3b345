"""第 13 章 自动找出最大 batch（ch13-max-batch）.

Kind "max_batch": the harness builds the model and a fresh AdamW (no optimizer state yet), shrinks
the device to a virtual card of `budget_mib`, and calls `find_max_batch(model, optimizer,
make_batch, device)`. The learner writes the probe (a full training step), the OOM recovery
(catch, drop what the failed attempt holds, outside the except block) and the search. The answer
must equal the truth of the trusted run (a linear search with full steps, kinds/max_batch.py); the
number of batch sizes tried may not exceed `max_trials(answer)` (doubling then bisection needs about
2·log2(answer)). A probe without the optimizer step over-estimates (AdamW's state is created
lazily at the first step); a recovery that keeps the failed attempt's graph alive under-estimates.
"""
from ..grader.kinds import max_batch
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch


def find_max_batch(model, optimizer, make_batch, device):
    """起始代码：什么都不试，直接返回 1。
    batch 1 当然放得下，可这张卡的大部分显存都闲着。"""
    return 1
'''

TARGET_NOTE = ("Measured on the sim at ci scale (grade_source with VRAMLAB_GRADE_CORES=1, torch 2.13.0+cpu, "
               "2026-12-02). Visible (tiny with 4 layers, seq 32, an 80 MiB card): the truth is 21; the reference "
               "tries 10 batch sizes (allowed 12, ratio 0.83); tests/alternatives/ch13-max-batch: two_steps_per_probe "
               "10 (0.83); forward_backward_only answers 32 (no AdamW state: over-estimates), keep_failed_graph 20 "
               "(the failed attempt's graph and gradients still held: under-estimates), fitted_bounds 21 visibly. "
               "Hidden (2 layers, a 56 MiB card): the truth is 32; the reference 12 trials of 14 (0.86), "
               "forward_backward_only 35, fitted_bounds 22. The starter returns 1 (incorrect, no trial). A first "
               "probe on the fresh optimizer at 22 fits on the visible card (the first-step trap: AdamW's state is "
               "created after backward has freed the activations).")

SPEC = ExerciseSpec(
    id="ch13-max-batch",
    chapter=13,
    title="自动 batch 调优：在虚拟显卡上找最大的 batch",
    task=(
        "评分器建好模型和一个**刚创建、还没走过一步**的 AdamW，把设备缩成一块**虚拟显卡**"
        "（显存预算比模型需要的大一些，但放不下很大的 batch），然后调用 "
        "`find_max_batch(model, optimizer, make_batch, device)`。`make_batch(n)` 返回一个 n 行的 token 批，"
        "已经在设备上，既作输入也作标签。放不下时，PyTorch 会像在真卡上一样抛出显存不足的异常。\n\n"
        "请返回**训练时能放下的最大 batch**：评分器在你返回之后，用完整的训练步（前向、反向、优化器更新）"
        "复查 n 放得下、n + 1 放不下。怎么试探、放不下之后怎么让进程恢复到能接着试的状态，都由你的代码负责；"
        "试探次数有上限，一个一个往上试会超。\n\n"
        "起始代码直接返回 1：一定放得下，却浪费了大半张卡。"
    ),
    function="find_max_batch",
    signature="def find_max_batch(model, optimizer, make_batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=1, seq=32, steps=1, warmup=0,
             settings=max_batch.Settings(budget_mib=80, max_batch_allowed=4096, config={"n_layer": 4},
                                         cublas_workspace=False),
             hidden=(Variation(catches="an answer hard-coded to the visible card (21), or a search whose bounds "
                                       "were tuned to it: a shallower model on a smaller card",
                               config={"n_layer": 2}, settings={"budget_mib": 56}),)),
    gpu=Scale(model="gpt2-small", batch=1, seq=1024, steps=1, warmup=0,
              settings=max_batch.Settings(budget_mib=16 * 1024, max_batch_allowed=4096)),
    target_ratio=1.0,
    points=10,
    kind="max_batch",
    metric="trials",
    hints=(
        "评分器复查时跑的是完整的一步训练。你的试探和它做的事一样吗？AdamW 的一阶矩和二阶矩是什么时候才分配的？",
        "一次试探放不下以后，还有哪些对象引用着那次前向留下的激活值和已经算出的梯度？下一次试探开始时，它们释放了吗？",
        "先把 batch 一路翻倍，直到第一次放不下；再在最后一个放得下的和第一个放不下的之间二分。"
        "每次试探都走完前向、反向和优化器更新；放不下时只记下结果，离开异常处理块之后再清理。",
        "`try: ...; optimizer.step()` / `except torch.OutOfMemoryError: oom = True`；"
        "在 except 块之外 `loss = batch = None`、`optimizer.zero_grad(set_to_none=True)`，"
        "再 `gc.collect()`、`device.empty_cache()`。",
    ),
    giveaways=(r"except\s*\(?\s*(torch\.)?(cuda\.)?OutOfMemoryError", r"optimizer\.step\(\)",
               r"zero_grad\(", r"empty_cache\(\)"),
)
