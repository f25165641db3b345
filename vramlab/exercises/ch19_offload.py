"""第 19 章 优化器状态卸载到主存（ch19-offload）.

Kind "train_step": the plain contract of chapters 5-7 (GPT-2 and torch AdamW built by the grader),
judged on the same losses and parameter updates as the starter and the steady peak. Host memory is
the point here (settings.allow_host): `device.host()` / `to_host()` are allowed, an optimizer over host
copies of the parameters is allowed, and the physical floor is parameters + gradients (the two
AdamW states may legitimately leave the device).
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, plain_train_step

STARTER = plain_train_step('普通的一步：AdamW 的一阶矩、二阶矩（每个参数 8 字节）都在显存里，\n再加上 foreach 实现的临时张量，优化器一步的峰值比参数和梯度加起来还高。')

SOLUTION = '''\
import torch


def train_step(model, optimizer, batch, device):
    """优化器状态卸载（ZeRO-Offload 的做法）：主存里放一份 FP32 参数和 AdamW，
    梯度搬到主机、在主机上更新，再把新参数拷回显存。AdamW 的状态从不进显存。"""
    params = list(model.parameters())
    if not hasattr(model, "_host_adamw"):          # 第一次调用时创建，之后每步复用
        hyper = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "foreach")}
        with device.host():
            host_params = [device.to_host(p) for p in params]
            model._host_adamw = (host_params, torch.optim.AdamW(host_params, **hyper))
    host_params, host_optimizer = model._host_adamw
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    for hp, p in zip(host_params, params):
        hp.grad = device.to_host(p.grad)
        p.grad = None                               # 梯度搬走就释放
    with device.host():
        host_optimizer.step()                       # 状态和临时张量都在主存里
        host_optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for hp, p in zip(host_params, params):
            p.copy_(device.to_device(hp))
    return loss.item()
'''

TARGET_NOTE = ("Measured on the sim at ci scale (2-layer GPT-2, d 256, vocab 8192, batch 2 x 64, cuBLAS workspaces "
               "off): the solution is 0.61x the starter (the peak moves to the end of backward: parameters + "
               "gradients + activations). Target 0.75x: offloading the gradients during backward "
               "(post-accumulate-grad hooks) goes lower still.")

SPEC = ExerciseSpec(
    id="ch19-offload",
    chapter=19,
    title="优化器状态卸载：AdamW 的状态留在主存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。"
        "`optimizer` 是评分器建好的 `torch.optim.AdamW`。\n\n"
        "起始代码是普通的一步：AdamW 的一阶矩和二阶矩（每个参数 8 字节）都在显存里，"
        "`optimizer.step()` 时还有 foreach 实现的临时张量。\n\n"
        "请把优化器状态**卸载到主存**（ZeRO-Offload 的思路）：在主机上保存一份 FP32 参数和一个 AdamW"
        "（第一次调用时创建，存在模型的一个属性上，之后复用），每步把梯度搬到主机、在主机上更新，"
        "再把新参数拷回设备。本题允许使用 `device.host()`、`device.to_host()`、`device.to_device()`。"
        "损失和参数更新都要与起始代码一致。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=2, seq=64, steps=2, warmup=1,
             settings=train_step.Settings(allow_host=True, cublas_workspace=False,
                                          config={"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 8192})),
    gpu=Scale(model="gpt2-small", batch=4, seq=512, steps=3, warmup=1, settings=train_step.Settings(allow_host=True)),
    target_ratio=0.75,
    points=10,
    hints=(
        "主机上的 AdamW 要用与 `optimizer.defaults` 相同的超参数，第一次调用时创建并存起来，每步新建会丢掉状态。",
        "梯度用 `device.to_host(p.grad)` 搬到主机后，把设备上的 `p.grad` 设为 None，让它立刻释放。",
        "主机上的 `step()` 要写在 `with device.host():` 里：状态和临时张量都属于主存。",
        "新参数用 `p.copy_(device.to_device(hp))`（在 `torch.no_grad()` 里）拷回设备。",
    ),
)
