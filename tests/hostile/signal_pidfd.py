# expect: forbidden|starter|exception
# 用 pidfd 发信号：os.pidfd_open(父进程) + signal.pidfd_send_signal()，不经过 os.kill（没有 os.kill 审计事件）。
# 和 signal_parent 一样只发 SIGURG（测试进程收到即判失守），对 pid 1 只用信号 0 探测。
# Signal the parent through a pidfd (no os.kill audit event).
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：SIGURG 送到了评分器进程，pid 1 也探测得到（没有 os.kill 审计事件）。
import os
import signal

import torch


def _signal():
    ppid = os.getppid()
    if ppid > 1:
        try:
            fd = os.pidfd_open(ppid)
            try:
                signal.pidfd_send_signal(fd, signal.SIGURG)
            finally:
                os.close(fd)
        except OSError:
            pass
    if os.getpid() != 1:
        try:
            fd = os.pidfd_open(1)
        except OSError:
            return
        try:
            signal.pidfd_send_signal(fd, 0)
            with open("/proc/1/cmdline", "rb") as f:
                cmd = f.read()
            if b"bwrap" not in cmd and b"vramlab" not in cmd:
                raise RuntimeError("ESCAPED: a pidfd reached pid 1 outside the sandbox")
        except OSError:
            pass
        finally:
            os.close(fd)


def train_step(model, optimizer, batch, device):
    _signal()
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
