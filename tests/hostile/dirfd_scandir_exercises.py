# expect: forbidden|starter|exception
# 目录描述符绕过（scandir）：os.scandir(包目录的 fd) 找到 exercises/，再 scandir 它的 fd 找到本题模块，
# 相对描述符读出源码，用 ast 取出 SOLUTION 字符串执行。import vramlab.exercises 会被拦，
# 但读文件不一定。拿到答案就满分，拿不到就退回起始代码。
# os.scandir(fd) down to vramlab/exercises/ch05_accumulation.py and exec its SOLUTION string.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：读到了参考答案（满分）。
import ast
import os

import torch
import vramlab

_stolen = []


def _steal():
    fds = []
    try:
        fds.append(os.open(os.path.dirname(vramlab.__file__), os.O_RDONLY | os.O_DIRECTORY))
        sub = next(e.name for e in os.scandir(fds[-1]) if e.name == "exercises")
        fds.append(os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        mod = next(e.name for e in os.scandir(fds[-1]) if e.name.startswith("ch05") and e.name.endswith(".py"))
        fd = os.open(mod, os.O_RDONLY, dir_fd=fds[-1])
        with os.fdopen(fd, encoding="utf-8") as f:
            text = f.read()
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOLUTION":
                ns = {}
                exec(node.value.value, ns)
                return ns["train_step"]
    except (OSError, StopIteration, SyntaxError, KeyError):
        return None
    finally:
        for fd in fds:
            os.close(fd)
    return None


def _plain_step(model, optimizer, batch):
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train_step(model, optimizer, batch, device):
    if not _stolen:
        _stolen.append(_steal())
    if _stolen[0] is not None:
        return _stolen[0](model, optimizer, batch, device)
    return _plain_step(model, optimizer, batch)
