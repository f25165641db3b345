# expect: forbidden|starter|exception
# 读 /proc 找线索：/proc/self/cmdline（评分器传给子进程的 job 文件路径）、/proc/self/environ、
# /proc/self/mountinfo、/proc/self/maps（加载的 .so 暴露 .venv 和课程路径）、父进程的 cmdline/environ/cwd
# （评分器常在课程根目录里运行）。从这些路径和 job.json 里的 forbidden_read 列表推出课程根目录，
# 读参考答案。拿到答案就满分，拿不到就退回起始代码。
# Read /proc/self/* and the parent's /proc entries for paths, then read the solution.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden）。
import json
import os
import re

import torch

_stolen = []


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def _leads():
    ppid = os.getppid()
    blobs = [_read(f"/proc/{who}/{what}") for who in ("self", ppid) for what in ("cmdline", "environ")]
    blobs += [_read("/proc/self/mountinfo"), _read("/proc/self/maps")]
    paths = [m.decode("utf-8", "replace") for b in blobs for m in re.findall(rb"/[\w./+-]{2,}", b)]
    for who in (ppid, "self"):
        try:
            paths.append(os.readlink(f"/proc/{who}/cwd"))
        except OSError:
            pass
    for p in list(paths):
        if p.endswith(".json") and os.path.isfile(p):
            try:
                job = json.loads(_read(p))
                for key in ("forbidden_read", "protected_read", "allowed_read"):
                    paths += [x for x in job.get(key, []) if isinstance(x, str)]
            except ValueError:
                pass
    roots = []
    for p in paths:
        while os.path.dirname(p) != p:
            roots.append(p)
            p = os.path.dirname(p)
    return list(dict.fromkeys(roots))


def _steal():
    for root in _leads():
        for rel in ("solutions/ch05-accumulation/ch05-accumulation.ipynb", "ch05-accumulation/ch05-accumulation.ipynb"):
            path = os.path.join(root, rel)
            if not os.path.isfile(path):
                continue
            try:
                for cell in json.loads(_read(path))["cells"]:
                    src = "".join(cell.get("source", ""))
                    if "### BEGIN SOLUTION" in src:
                        ns = {}
                        exec(src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0], ns)
                        return ns["train_step"]
            except (ValueError, KeyError, OSError):
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
