"""第 28 章 激活值卸载到主存（ch28-activation-offload）.

Kind "train_step" with host memory allowed (settings.allow_host): the plain step keeps every tensor saved
for backward on the device; with `device.save_on_cpu()` (vramlab's `torch.autograd.graph.save_on_cpu`)
they wait in host memory and come back one at a time during backward. Activations dominate this
workload (4 layers, batch 8 x 128); cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import train_step
from .spec import ExerciseSpec, Scale, plain_train_step

STARTER = plain_train_step('普通的一步：前向为反向保存的激活值全部留在显存里，\n直到反向用完才释放。层数、batch 和序列越大，这部分越是峰值的大头。')

SOLUTION = '''\
import torch


def train_step(model, optimizer, batch, device):
    """激活值卸载：前向在 save_on_cpu 里运行，为反向保存的张量一产生就拷到主存，
    反向需要时再拷回来、用完即释放。显存里同时只有正在用的那几块。"""
    with device.save_on_cpu():
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch28-activation-offload",
    chapter=28,
    title="激活值卸载：为反向保存的张量放进主存",
    task=(
        "`train_step(model, optimizer, batch, device)` 做一次参数更新并返回损失（Python `float`）。\n\n"
        "起始代码是普通的一步：前向为反向保存的激活值全部留在显存里。请把它们**卸载到主存**："
        "在 `with device.save_on_cpu():` 里做前向（它对应 PyTorch 的 "
        "`torch.autograd.graph.save_on_cpu(pin_memory=True)`），为反向保存的张量一产生就拷到主存，"
        "反向用到时再拷回设备。本题允许使用 `device.save_on_cpu()`、`device.host()`、`device.to_host()`、"
        "`device.to_device()`。损失和参数更新都要与起始代码一致。"
    ),
    function="train_step",
    signature="def train_step(model, optimizer, batch, device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=8, seq=128, steps=2, warmup=1,
             settings=train_step.Settings(allow_host=True, cublas_workspace=False,
                                          config={"n_layer": 4, "n_embd": 256, "n_head": 4})),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=3, warmup=1,
              settings=train_step.Settings(allow_host=True)),
    target_ratio=0.6,
    points=10,
    hints=(
        "只有前向需要包在 `with device.save_on_cpu():` 里：反向会自动把保存的张量拷回来。",
        "卸载省的是“为反向保存的激活值”；参数、梯度、优化器状态和 logits 的临时张量不受影响。",
        "在真实 GPU 上，`pin_memory=True` 的锁页内存让拷贝能异步进行，代价是 PCIe 带宽和主存。",
    ),
)
