# expect: forbidden|technique|too_much_memory|tamper
# go for the warm worker (pid 1 of the sandbox, grader/worker.py) that every later grading in this
# sandbox is forked from: stop or kill it, write into its memory through /proc/1/mem, ptrace it.
# Signals from inside its namespace to pid 1 are dropped, it is not dumpable and /proc is read-only;
# the step is the starter's, so the submission fails on memory if nothing is refused first
import ctypes
import os
import signal


def train_step(model, optimizer, batch, device):
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        try:
            os.kill(1, sig)
        except OSError:
            pass
    try:
        with open("/proc/1/mem", "r+b") as mem:
            mem.seek(0x400000)
            mem.write(b"\xcc")
    except OSError:
        pass
    try:
        ctypes.CDLL(None).ptrace(16, 1, None, None)          # PTRACE_ATTACH
    except (OSError, AttributeError):
        pass
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
