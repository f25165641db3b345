"""第 8 章 梯度原地 AllReduce（ch08-allreduce）.

Kind "train_step" on 2 gloo processes (data parallel): the grader starts both ranks, initialises
torch.distributed, gives each rank its half of every global batch and judges every rank's losses
and parameter update against the same rank of the trusted starter run, and the worst rank's
steady peak. The simulated cuBLAS workspaces are off at ci scale (a fixed 64 MiB for both codes
would hide the one gradient-sized buffer this exercise is about), and the ci batch is small (2 x 32
tokens globally): the peak is then the optimizer step, where the starter's flat buffer is still alive,
not the activations, which no way of averaging the gradients changes.
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """数据并行的一步：本 rank 的半个 batch 前向、反向，再在所有 rank 之间平均梯度。
    起始代码把全部梯度拼成一块扁平缓冲区再 AllReduce：通信只有一次，
    但每个 rank 都多占了一整份梯度大小的显存，而且它一直活到函数返回。"""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''

def averaged_train_step(doc: str) -> str:
    """Data parallel with the gradients averaged in place, one parameter at a time: the solution
    here and the starter of ch10-zero (which then shards the optimizer state)."""
    lines = "\n    ".join(doc.strip().splitlines())
    return f'''import torch
import torch.distributed as dist


def train_step(model, optimizer, batch, device):
    """{lines}"""
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''


TARGET_NOTE = ("Measured on the sim at ci scale (tiny, global batch 2 x 32, 2 ranks; grade_source per file, "
               "VRAMLAB_GRADE_CORES=1, 2026-12-02), visible / hidden (n_embd 160, 1 layer, seed 1): starter 13.58 MiB; "
               "solution 0.833x / 0.834x; tests/alternatives/ch08-allreduce: buckets, async_in_place 0.833x / 0.834x; "
               "cloned_grads_counter and keep_buckets_counter 1.00x (too_much_memory); fitted_fixed_buffer (a buffer the "
               "size of the visible largest gradient) 0.87x visibly, raises in the hidden case. Forgetting to divide by "
               "the world size is NOT caught: AdamW's update is invariant to a gradient scale (up to eps), the update "
               "differs by far less than update_rtol; the hint still asks for the average. "
               "With small activations the peak is the optimizer step: parameters, gradients, AdamW's two moments "
               "and its foreach temporaries (5 x 4 bytes per parameter) against the starter's 6 x 4 with its flat copy "
               "alive, so 5/6 = 0.833x whatever the shapes, 10.4% inside the target of 0.93x. At the earlier scale "
               "(global batch 4 x 64) the activations set the solution's peak and it landed at 0.88x, inside the target "
               "by 5% only. Freeing the flat buffer before optimizer.step() also reaches 0.833x: the concatenation "
               "moment (gradients + flat copy) then ties with the step. 2026-12-05: a fixed 256 KiB buffer reused across "
               "steps and alive through optimizer.step(), which the task allows, 0.852x / 0.853x: inside the target, "
               "not the 10% margin (tests/test_alternatives.py THIN_MARGIN says why).")

SPEC = ExerciseSpec(
    id="ch08-allreduce",
    chapter=8,
    title="梯度 AllReduce：不要为通信再拷一份梯度",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半。\n\n"
        "`train_step(model, optimizer, batch, device)` 在本 rank 的数据上前向、反向，"
        "让每个参数的梯度变成所有 rank 上这个梯度的**平均值**，然后更新参数、清空梯度，"
        "返回本 rank 的损失（Python `float`）。\n\n"
        "起始代码的结果是对的，但为了通信，每个 rank 都多占了一整份梯度大小的显存。"
        "请把它去掉，让通信需要的额外显存与模型大小无关（最多是一个固定的小缓冲区）：\n\n"
        "1. 每个 rank 的损失和参数更新与起始代码一致（在浮点误差范围内）；\n"
        "2. 评分看**两个 rank 中峰值较大的那个**，它不能超过起始代码的目标比例。\n\n"
        "怎么量：评分器对每个 rank 分别比较损失和训练后参数的变化量（与起始代码同一个 rank 的结果比），"
        "并记录每个 rank 预热一步之后的最大已分配显存。隐藏配置里模型的宽度和层数不同，"
        "不要按这里的模型写死缓冲区的大小或参数的个数。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    # hidden: wider (160: the largest gradient outgrows a buffer sized for the visible one) and one layer
    # (fewer parameters than the visible model, so it costs no more to grade)
    ci=Scale(model="tiny", batch=2, seq=32, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False),
             hidden=(Variation(catches="a communication buffer or bucket layout sized for the visible model's gradients",
                               seed=1, config={"n_embd": 160, "n_layer": 1}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1, settings=train_step.Settings(world_size=2)),
    target_ratio=0.93,
    points=10,
    hints=(
        "峰值出现在哪一刻？那一刻除了参数、梯度和优化器状态，还有哪块和全部梯度一样大的张量活着？它非存在不可吗？",
        "AllReduce 对交给它的张量原地求和，任何一块连续的浮点张量都可以当通信缓冲区，梯度张量本身也可以。"
        "如果一定要先拼接，一次只拼一小段（一个桶），通信完拷回去就释放。",
        "别忘了 AllReduce 默认求和，而起始代码求的是平均；除法也原地做，不要另建一个张量。",
        "写法：`for p in model.parameters(): dist.all_reduce(p.grad); p.grad /= dist.get_world_size()`，"
        "然后照常 `optimizer.step()`、`optimizer.zero_grad(set_to_none=True)`。",
    ),
    giveaways=(r"all_reduce\(\s*p\.grad", r"register_post_accumulate_grad_hook", r"async_op"),
)
