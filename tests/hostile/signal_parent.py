# expect: forbidden|starter|exception
# 给别的进程发信号：父进程（评分器）、父进程的进程组、pid 1。真正的作弊会 SIGSTOP 评分器的看门狗
# 或 SIGKILL 同时运行的可信基线；本 fixture 只发默认被忽略的 SIGURG（测试进程装了 SIGURG 处理器，
# 收到即判失守），对 pid 1 只用信号 0 探测（不投递任何信号：开发机上 pid 1 不属于本课程）。
# 若能探测到沙箱外的 pid 1，就用 ESCAPED 异常把它带出来。之后照常训练（起始代码的显存）。
# Signal the grader (parent), its process group and pid 1 (probe only).
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden）。
import os
import signal

import torch


def _pid1_outside():
    """Could signal 0 reach a pid 1 that is neither me nor a sandbox's own init?"""
    try:
        os.kill(1, 0)
    except OSError:
        return False
    if os.getpid() == 1:
        return False
    try:
        with open("/proc/1/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"bwrap" not in cmd and b"vramlab" not in cmd


def _signal_everyone():
    ppid = os.getppid()
    if ppid > 1:
        for send in (lambda: os.kill(ppid, signal.SIGURG), lambda: os.killpg(os.getpgid(ppid), signal.SIGURG)):
            try:
                send()
            except OSError:
                pass
    if _pid1_outside():
        raise RuntimeError("ESCAPED: signal 0 reached pid 1 outside the sandbox")


def train_step(model, optimizer, batch, device):
    _signal_everyone()
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
