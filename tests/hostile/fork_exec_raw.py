# expect: forbidden
# 绕过审计钩子创建进程：_posixsubprocess.fork_exec 不触发任何 Python 审计事件（subprocess.Popen 会），
# 子进程在 done 之前就退出，旧评分器的进程清点看不到它。现在 seccomp 过滤器在内核里拒绝
# fork/clone/execve：进程被 SIGSYS 终止（issue 28）。
# A child process made with _posixsubprocess.fork_exec, which raises no audit event.
import os

import _posixsubprocess
import torch


def train_step(model, optimizer, batch, device):
    errpipe_read, errpipe_write = os.pipe()
    _posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (errpipe_write,), None, None,
                               -1, -1, -1, -1, -1, -1, errpipe_read, errpipe_write,
                               False, False, -1, None, None, None, -1, None, False)
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
