# expect: forbidden|starter|exception
# 找课程根目录：从工作目录、vramlab.__file__、torch.__file__、sys.prefix、sys.executable 一路往上走，
# 再试 /work/main，凡是有 solutions/、source/（nbgrader 的源 notebook 含答案）或 vramlab/exercises/ 的
# 目录都去读本题答案（普通 open）。拿到答案就满分，拿不到就退回起始代码。
# Walk up from every path the process knows to find the course root and read the solution.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden）。
import ast
import json
import os
import sys

import torch
import vramlab

_stolen = []


def _roots():
    seeds = [os.getcwd(), vramlab.__file__, torch.__file__, sys.prefix, sys.executable, "/work/main"]
    out = []
    for s in seeds:
        p = os.path.abspath(s)
        while True:
            out.append(p)
            if os.path.dirname(p) == p:
                break
            p = os.path.dirname(p)
    return list(dict.fromkeys(out))


def _solution_step(text):
    code = None
    try:
        for cell in json.loads(text).get("cells", []):
            src = "".join(cell.get("source", ""))
            if "### BEGIN SOLUTION" in src:
                code = src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    except ValueError:
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOLUTION":
                code = node.value.value
    ns = {}
    if code:
        exec(code, ns)
    return ns.get("train_step")


def _steal():
    for root in _roots():
        for rel in ("solutions/ch05-accumulation/ch05-accumulation.ipynb", "source/ch05-accumulation/ch05-accumulation.ipynb",
                    "vramlab/exercises/ch05_accumulation.py"):
            path = os.path.join(root, rel)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    step = _solution_step(f.read())
                if step:
                    return step
            except (OSError, ValueError, SyntaxError):
                pass
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
