"""第 28 章 激活值卸载到主存（ch28-activation-offload）.

Kind "train_step" with host memory allowed (settings.allow_host): the plain step keeps every tensor saved
for backward on the device. The lesson is the chapter's offload policy, not the one line: what the
Transformer blocks save goes to host memory (`device.to_host` in a saved-tensors pack hook, back with
`device.to_device` in unpack), the weights (already resident) and what the output layer and the loss save
(needed again at the very moment of the peak) stay put. Activations dominate this workload (4 layers,
batch 8 x 128, vocabulary 4096); cuBLAS workspaces are off at ci scale.

The device peak alone cannot tell a policy from "offload everything" (moving everything always gives the
lowest peak), so the step's copies to host memory are measured too (settings.max_host_copy_ratio: the
bytes created under `device.host()` in the measured step, kinds/common.host_meter): at least some, and
at most 0.62 x the starter's peak. Wrapping the whole forward in `device.save_on_cpu()` moves the
weights' and the output layer's saved tensors as well and exceeds it.
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('普通的一步：前向为反向保存的激活值全部留在显存里，\n直到反向用完才释放。层数、batch 和序列越大，这部分越是峰值的大头。')

TARGET_NOTE = ("Measured on the sim at ci scale (VRAMLAB_GRADE_CORES=1, grade_source; D2H = bytes created under "
               "dev.host() in the measured step, counted by a prototype meter outside the grader): starter 215.8 MiB "
               "visible, 172.0 MiB hidden (batch 6, seed 1). Reference (blocks' saved tensors to host, weights and "
               "the output layer's/loss's tensors kept) 0.462 / 0.507, D2H 116.1 / 87.1 MiB; checkpoint + offload "
               "only the block inputs 0.472 / 0.536, D2H 4.0 / 3.0 MiB; save_on_cpu() around the whole forward "
               "0.453 / 0.503, D2H 166.2 / 128.6 MiB; the same skipping weights by storage 0.453 / 0.498, D2H "
               "150.1 / 112.6 MiB; checkpointing alone 0.480 / 0.536, no D2H; save_on_cpu() around backward only "
               "1.00; a rule keyed on the visible shapes (8 or 1024 rows) 0.453 visible, 1.00 hidden. Target 0.6. "
               "Host-copy budget (settings.max_host_copy_ratio) 0.62 x the starter's peak (133.8 / 106.7 MiB): "
               "the reference uses 0.87 / 0.82 of it, the checkpoint variant 0.03; the whole-forward wrap 1.24 / "
               "1.21 fails (technique), checkpointing alone copies nothing and fails (technique). The gpu scale's "
               "budget is the same ratio, not measured on a GPU.")

SPEC = ExerciseSpec(
    id="ch28-activation-offload",
    chapter=28,
    title="激活值卸载：只把值得搬的张量放进主存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码是普通的一步：前向为反向保存的激活值全部留在显存里，它们是峰值的大头。请让这些张量在前向之后"
        "待在**主存**里，反向用到时再回到显存，把稳态峰值降到目标比例以下；损失和参数更新都要与起始代码一致。"
        "本题允许把张量放进主存（设备对象上与主存有关的接口，本章讲过）；在其他练习里，它们会被当成绕过计量。\n\n"
        "每一个搬到主存的字节都要过两趟 PCIe：请像本章“智能卸载策略”一节那样挑着搬。搬了省不下峰值的张量"
        "（本来就常驻显存的，或者峰值那一刻马上又要用的）只会白白占用带宽和主存。"
        "评分还会换一个批大小不同的配置，按张量形状或大小写死的规则拿不到分。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(allow_host=True, cublas_workspace=False, max_host_copy_ratio=0.62,
                                          config={"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 4096}),
             hidden=(Variation(catches="a rule written for the visible shapes (offload only tensors with 8 or "
                                       "1024 rows) offloads nothing at batch 6: the peak stays at the starter's",
                               batch=6, seed=1),)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(allow_host=True, max_host_copy_ratio=0.62)),
    target_ratio=0.6,
    points=10,
    hints=(
        "峰值出现在反向刚开始的那一刻：那时显存里是谁为反向保存的张量？它们是在前向的什么时候产生、反向的什么时候才用到的？",
        "autograd 每为反向保存一个张量，都可以交给你的一对函数处理：保存时把它换成别的东西（比如主存里的副本），"
        "反向用到时再换回来。只在 Transformer block 的前向里这样做，参数原样留下。",
        "`torch.autograd.graph.saved_tensors_hooks(pack, unpack)`：`pack` 里 `device.to_host(t)`，`unpack` 里 "
        "`device.to_device(...)`；用 block 的 forward pre-hook / forward hook 进入和退出它，"
        "`t.untyped_storage()` 与某个参数相同时直接返回 `t`。整个前向包进 `device.save_on_cpu()` 也能降峰值，"
        "但它连权重和输出层的张量也一起搬。",
    ),
    giveaways=(r"save_on_cpu\(\)", r"saved_tensors_hooks", r"to_host", r"untyped_storage"),
)
