# expect: forbidden
# os.posix_spawn 启动一个立即退出的子进程。Python 的审计钩子看得到它（os.posix_spawn 事件），内核的
# seccomp 过滤器也会因为 clone 而终止进程：两层都拒绝（issue 28）。
# A short-lived child started with os.posix_spawn.
import os

import torch


def train_step(model, optimizer, batch, device):
    os.posix_spawn("/bin/true", ["/bin/true"], {})
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
