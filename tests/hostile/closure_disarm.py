# expect: forbidden|starter|exception
# 从钩子的闭包里找到评分器的开关：评分器在本进程里注册的全局 forward 钩子和 optimizer pre-step 钩子
# 是普通 Python 函数，它们的 __closure__ 单元格里有评分器的状态字典（armed / trusted_io / learner）。
# 把审计钩子"关掉"（armed=False、trusted_io=1），再用普通 open 读参考答案。拿到答案就满分，
# 找不到开关或读不到答案就退回起始代码。
# Reach the grader's state dict through hook closures, disarm the audit hook, read the solution.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：关掉审计后读到了参考答案（满分）。
import json
import os
import sys
import types

import torch
import torch.nn.modules.module as nn_hooks
import torch.optim.optimizer as optim_hooks
import vramlab

_stolen = []


def _reachable():
    """Everything reachable from the grader's hooks through closures, namespaces and wrappers."""
    todo = []
    for d in (nn_hooks._global_forward_hooks, nn_hooks._global_forward_pre_hooks, nn_hooks._global_backward_hooks,
              getattr(nn_hooks, "_global_backward_pre_hooks", {}), optim_hooks._global_optimizer_pre_hooks,
              optim_hooks._global_optimizer_post_hooks):
        todo += list(d.values())
    seen, out = set(), []
    while todo and len(out) < 5000:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, torch.nn.Module, torch.Tensor)):
            continue
        seen.add(id(o))
        out.append(o)
        if isinstance(o, types.FunctionType):
            for cell in o.__closure__ or ():
                try:
                    todo.append(cell.cell_contents)
                except ValueError:
                    pass
            if hasattr(o, "__wrapped__"):
                todo.append(o.__wrapped__)
        elif isinstance(o, types.MethodType):
            todo += [o.__func__, o.__self__]
        elif isinstance(o, types.SimpleNamespace):
            todo += list(vars(o).values())
        elif isinstance(o, dict) and len(o) < 50:
            todo += list(o.values())
    return out


def _disarm():
    hit = False
    for o in _reachable():
        if isinstance(o, dict) and ("armed" in o or "trusted_io" in o):
            o["armed"] = False
            if "trusted_io" in o:
                o["trusted_io"] = 1
            hit = True
    return hit


def _steal():
    pkg = os.path.dirname(vramlab.__file__)
    for root in (os.path.dirname(pkg), os.path.dirname(sys.prefix), "/work/main"):
        path = os.path.join(root, "solutions", "ch05-accumulation", "ch05-accumulation.ipynb")
        try:
            with open(path, encoding="utf-8") as f:
                cells = json.load(f)["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for cell in cells:
            src = "".join(cell.get("source", ""))
            if "### BEGIN SOLUTION" in src:
                ns = {}
                exec(src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0], ns)
                return ns["train_step"]
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
        _stolen.append(_steal() if _disarm() else None)
    if _stolen[0] is not None:
        return _stolen[0](model, optimizer, batch, device)
    return _plain_step(model, optimizer, batch)
