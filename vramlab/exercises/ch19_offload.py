"""第 19 章 优化器状态卸载到主存（ch19-offload）.

Kind "train_step": the plain contract of chapters 5-7 (GPT-2 and torch AdamW built by the grader),
judged on the same losses and parameter updates as the starter and the steady peak. Host memory is
the point here (settings.allow_host): `device.host()` / `to_host()` are allowed, an optimizer over host
copies of the parameters is allowed, and the physical floor is parameters + gradients (the two
AdamW states may legitimately leave the device).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, Variation, plain_train_step

STARTER = plain_train_step('普通的一步：前向、反向、优化器更新。')

TARGET_NOTE = ("Measured on the sim at ci scale (2-layer GPT-2, d 256, vocab 8192, batch 2 x 64, cuBLAS workspaces "
               "off; torch 2.13.0+cpu, 2026-12-02, /tmp grade_source runs with VRAMLAB_GRADE_CORES=1), visible / hidden "
               "(1 layer, lr 3e-3): starter 74.11 MiB; the reference (host copy + host AdamW) 0.61x / 0.63x; "
               "tests/alternatives/ch19-offload: offload_grads_in_backward 0.52x / 0.57x, "
               "new_host_optimizer_every_step incorrect, fitted_hardcoded_hyper passes visibly and is incorrect in "
               "the hidden case. Known hole (kind train_step, not fixed here): calling the grader's own optimizer "
               "inside `with device.host():` puts its state off the meter and passes at 0.61x; on a real card it "
               "offloads nothing. Target 0.75x: offloading the gradients during backward "
               "(post-accumulate-grad hooks) goes lower still. The hidden case changes the grader's learning rate "
               "(and is one layer, cheaper): code that copies the chapter's hyperparameters instead of reading the "
               "grader's optimizer updates differently.")

SPEC = ExerciseSpec(
    id="ch19-offload",
    chapter=19,
    title="优化器状态卸载：AdamW 的状态留在主存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。"
        "`optimizer` 是评分器建好的 AdamW，管着模型的全部参数。\n\n"
        "起始代码是最普通的一步。请让 AdamW 的状态**不再占显存**：更新照样做，而且与起始代码的更新一致，"
        "但优化器要保存的东西放在主存里。本题允许使用主存：`with device.host():` 里新建的张量属于主存，"
        "`device.to_host(t)` 和 `device.to_device(t)` 在两边之间复制（其他练习里它们会被当成绕过计量）。"
        "评分器的优化器的超参数以它自己为准，不一定是默认值。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=2, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(allow_host=True, cublas_workspace=False,
                                          config={"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 8192}),
             hidden=(Variation(catches="hyperparameters copied from the chapter's example (lr 1e-3) instead of read "
                                       "from the grader's optimizer: another learning rate, one layer",
                               config={"n_layer": 1}, settings={"lr": 3e-3}),)),
    gpu=Scale(model="gpt2-small", batch=4, seq=512, steps=3, warmup=1, settings=train_step.Settings(allow_host=True)),
    target_ratio=0.75,
    points=10,
    hints=(
        "起始代码峰值时，显存里除了参数、梯度和激活值，还有哪些张量？它们是谁在什么时候创建的？",
        "优化器的状态要跨步保留：主存里的那一份在哪里创建、存在哪里，第二步才能接着用？"
        "超参数要和评分器的优化器一致，从哪里读？",
        "在主存里保留一份参数和对应的优化器（第一次调用时创建并存在模型的属性上）；每步把梯度复制到主存、"
        "释放设备上的梯度，在主存里更新，再把新参数复制回设备。",
        "`hp.grad = device.to_host(p.grad)`、`p.grad = None`；`with device.host(): host_optimizer.step()`；"
        "`p.copy_(device.to_device(hp))`；主机上的 `torch.optim.AdamW(host_params, **超参数)` 取自 `optimizer.defaults`。",
    ),
    giveaways=(r"to_host\(\s*p\.grad", r"AdamW\(\s*host", r"\.grad\s*=\s*None", r"p\.copy_\(",
               r"register_post_accumulate_grad_hook"),
)
