# expect: forbidden|starter|exception
# 目录描述符绕过（列目录）：打开 vramlab 包目录得到 fd，os.open("..", dir_fd=fd) 走到课程根目录，
# 再用 os.listdir(fd) 一层层列出 solutions/ 找到本题的 notebook，相对描述符读出参考答案。
# os.listdir(整数) 的审计事件只带一个数字，看不出列的是哪个目录。拿到答案就满分，拿不到就退回起始代码。
# Walk from the package directory to ../solutions with dir_fd and os.listdir(fd).
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：读到了参考答案（满分）。
import json
import os

import torch
import vramlab

_stolen = []


def _read_at(dfd, name):
    fd = os.open(name, os.O_RDONLY, dir_fd=dfd)
    try:
        out = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return out.decode("utf-8")
            out += chunk
    finally:
        os.close(fd)


def _steal():
    fds = []
    try:
        fds.append(os.open(os.path.dirname(vramlab.__file__), os.O_RDONLY | os.O_DIRECTORY))
        fds.append(os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))        # the course root
        if "solutions" not in os.listdir(fds[-1]):
            return None
        fds.append(os.open("solutions", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        folder = next(n for n in os.listdir(fds[-1]) if n.startswith("ch05"))
        fds.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        nb = next(n for n in os.listdir(fds[-1]) if n.endswith(".ipynb"))
        for cell in json.loads(_read_at(fds[-1], nb))["cells"]:
            src = "".join(cell.get("source", ""))
            if "### BEGIN SOLUTION" in src:
                ns = {}
                exec(src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0], ns)
                return ns["train_step"]
    except (OSError, StopIteration, ValueError, KeyError):
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
