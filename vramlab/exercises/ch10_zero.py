"""第 10 章 ZeRO-1：切分优化器状态（ch10-zero）.

Kind "train_step" on 2 gloo processes (data parallel), judged like ch08: every rank's losses and
parameter update against the same rank of the trusted starter run, and the worst rank's steady
peak. The starter is plain data parallelism (every rank keeps the full AdamW state); sharding the
state across the 2 ranks saves a quarter of the model states (16 -> 12 bytes per parameter).
cuBLAS workspaces are off at ci scale, as in ch08. The ci batch is small (2 x 32 tokens globally) so
that the model states, which are what ZeRO-1 shards, dominate the peak; the physical floor is then
12 bytes per parameter (floor_copies=3: parameters, gradients, half of AdamW's two moments).
"""
from .ch08_allreduce import averaged_train_step
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation

STARTER = averaged_train_step("""普通的数据并行（DDP 的做法）：梯度求平均后，每个 rank 都用完整的 AdamW 更新全部参数，
于是每个 rank 都存着一整份一阶矩和二阶矩。""")

TARGET_NOTE = ("Measured on the sim at ci scale (tiny, global batch 2 x 32, 2 ranks, floor_copies=3; grade_source per "
               "file, VRAMLAB_GRADE_CORES=1, 2026-12-02), visible / hidden (1 layer, seed 1): starter 11.32 MiB; "
               "solution (ZeroRedundancyOptimizer) 0.688x / 0.733x; tests/alternatives/ch10-zero: zero_redundancy_optimizer "
               "0.700x / 0.733x, shard_contiguous 0.732x / 0.782x, shard_round_robin_by_size 0.733x / 0.783x (all 10% "
               "inside the 0.90 target: <= 0.81), shard_round_robin 0.93x (rank 0 holds 88% of the elements: "
               "too_much_memory), new_optimizer_each_step_counter incorrect, fitted_block_per_rank (block i -> rank i) "
               "0.80x visible, refused in the hidden case (rank 1 owns nothing, so it never steps: incorrect). At the earlier scale (global batch 4 x 64) activations "
               "took a larger share and the reference landed at 0.81x, 9% inside the target.")

SPEC = ExerciseSpec(
    id="ch10-zero",
    chapter=10,
    title="ZeRO-1：每个 rank 只存一部分优化器状态",
    task=(
        "评分器启动 **2 个进程**（gloo 后端，数据并行），在运行你的代码之前初始化好 `torch.distributed`；"
        "每个 rank 拿到每个全局 batch 的一半，模型和一个普通的 `torch.optim.AdamW`（参数 `optimizer`）已经建好。\n\n"
        "`train_step(model, optimizer, batch, device)` 做一步数据并行训练并返回本 rank 的损失（Python `float`）。"
        "起始代码是 DDP 的做法：梯度求平均后，每个 rank 都用完整的 AdamW 更新全部参数，"
        "于是每个 rank 都存着一整份一阶矩和二阶矩（每个参数 8 字节），两个 rank 存的完全一样。\n\n"
        "请实现本章的 **ZeRO-1**，去掉这份重复：\n\n"
        "1. 每个 rank 只为一部分参数保存优化器状态，两个 rank 合起来覆盖全部参数，每个参数的状态只存一份；\n"
        "2. 每一步之后，两个 rank 上的全部参数都与起始代码的更新结果一致（在浮点误差范围内），损失也一致；"
        "优化器状态要跨步保留，第二步的更新才对得上；\n"
        "3. 评分看**两个 rank 中峰值较大的那个**，它不能超过起始代码的目标比例：切分不均，最差的 rank 就省不下多少。\n\n"
        "怎么量：评分器对每个 rank 分别比较损失和训练后参数的变化量（与起始代码同一个 rank 的结果比），"
        "并记录每个 rank 预热一步之后的最大已分配显存。隐藏配置里模型的层数不同，"
        "切分方式要从拿到的模型本身算出来，不能按这里的模型写死。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    # hidden: one block (a split "block i -> rank i" leaves rank 1 with nothing), another seed;
    # cheaper than the visible two-block model
    ci=Scale(model="tiny", batch=2, seq=32, steps=2, warmup=1,
             settings=train_step.Settings(world_size=2, cublas_workspace=False, floor_copies=3),
             hidden=(Variation(catches="a shard assignment fitted to 2 blocks on 2 ranks (block i -> rank i)",
                               seed=1, config={"n_layer": 1}),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=512, steps=3, warmup=1,
              settings=train_step.Settings(world_size=2, floor_copies=3)),
    target_ratio=0.9,
    points=10,
    hints=(
        "两个 rank 的 AdamW 状态一模一样：如果某个参数只由一个 rank 来更新，另一个 rank 还需要为它存一阶矩和二阶矩吗？"
        "更新完之后，另一个 rank 又怎样拿到这个参数的新值？",
        "把参数分成两组，每个 rank 用一个只含自己那组参数的 AdamW（超参数取自 `optimizer.defaults`），第一次调用时创建、"
        "存在模型的一个属性上以后复用；更新后由每个参数的主人把新值发给其他 rank。两组的元素个数要差不多："
        "GPT-2 的参数里大矩阵和小向量交替出现，按参数序号轮流分并不均匀。",
        "PyTorch 自带 `torch.distributed.optim.ZeroRedundancyOptimizer(model.parameters(), "
        "optimizer_class=type(optimizer), lr=..., betas=..., eps=..., weight_decay=...)`，梯度求平均后调用它的 "
        "`step()`；自己写时，分组更新后对每个参数 `dist.broadcast(p.data, src=拥有它的 rank)`。",
    ),
    giveaways=(r"ZeroRedundancyOptimizer", r"broadcast\(", r"optimizer_class"),
)
