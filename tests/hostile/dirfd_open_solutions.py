# expect: forbidden|starter|exception
# 目录描述符绕过（读参考答案）：先 os.open() 一个允许读的目录（vramlab 包、vramlab/sim、sys.prefix），
# 再 os.open("../solutions/…", dir_fd=fd) 相对这个描述符去读参考答案（solutions/<id>/solution.py、nbgrader
# 源 notebook，以及参考答案搬出包之前 exercises 模块里的 SOLUTION）。
# 审计钩子若把相对路径按工作目录去解析，就看不出真正的目标。拿到答案就用答案（满分）；
# 拿不到（沙箱里根本没有这些目录）就退回起始代码的做法，显存降不下来。
# Directory-descriptor bypass (read): open an allowed directory, then open the solution relative to it.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：读到了参考答案（满分）。
import ast
import json
import os
import sys

import torch
import vramlab

PKG = os.path.dirname(vramlab.__file__)
TRIES = ((PKG, "../solutions/ch05-accumulation/solution.py"),
         (PKG, "../solutions/ch05-accumulation/ch05-accumulation.ipynb"),
         (PKG, "exercises/ch05_accumulation.py"),
         (os.path.join(PKG, "sim"), "../../solutions/ch05-accumulation/ch05-accumulation.ipynb"),
         (sys.prefix, "../solutions/ch05-accumulation/ch05-accumulation.ipynb"))
_stolen = []


def _solution_step(text):
    code = None
    try:
        for cell in json.loads(text).get("cells", []):
            src = "".join(cell.get("source", ""))
            if "### BEGIN SOLUTION" in src:
                code = src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    except ValueError:
        if "def train_step" in text and "SOLUTION" not in text:      # solutions/<id>/solution.py
            code = text
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOLUTION":
                code = node.value.value
    ns = {}
    if code:
        exec(code, ns)
    return ns.get("train_step")


def _read_at(dfd, rel):
    fd = os.open(rel, os.O_RDONLY, dir_fd=dfd)
    try:
        data = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return data.decode("utf-8")
            data += chunk
    finally:
        os.close(fd)


def _steal():
    for base, rel in TRIES:
        try:
            dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            step = _solution_step(_read_at(dfd, rel))
            if step:
                return step
        except (OSError, ValueError, SyntaxError):
            pass
        finally:
            os.close(dfd)
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
