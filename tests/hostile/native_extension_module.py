# expect: forbidden
# 本机扩展模块：把一个 ELF（这里是 Python 自带的 _bisect 扩展的副本，换成别的 .so 也一样）写进评分目录，
# 用 importlib 的 ExtensionFileLoader 加载，不经过 ctypes（审计钩子对 ctypes 有规则，对这条路没有）。
# issue 28 里就是这样在常驻沙箱的 IPC 命名空间里留下 256 MiB 的 System V 共享内存段的。现在评分目录、
# /tmp 和 /dev/shm 挂载为 noexec：写进去的 ELF 映射不成可执行代码，加载失败。
# A native extension module written into the grading folder and loaded without ctypes.
import importlib.machinery
import os
import shutil

import _bisect
import torch


def train_step(model, optimizer, batch, device):
    target = os.path.join(os.getcwd(), "evil" + os.path.splitext(_bisect.__file__)[1])
    shutil.copy(_bisect.__file__, target)
    spec = importlib.machinery.ModuleSpec("_bisect", importlib.machinery.ExtensionFileLoader("_bisect", target),
                                          origin=target)
    spec.loader.create_module(spec)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
