"""What every entry point shares when something goes wrong: exit codes, the Chinese wording of OS
errors and exceptions, and a clean stop on SIGINT / SIGTERM / SIGHUP.

Exit codes (documented in docs/guide/grading.md, "退出码"):

    0    done (`vramlab grade`: graded, whatever the score)
    1    failed while running (a workload that errors, a tutorial that fails)
    2    bad arguments (unknown option, model, exercise, row or chapter; an option the mode ignores)
    3    the submission cannot be read (missing, a folder, empty, binary, not a notebook)
    4    the grader or this machine cannot grade (full temp disk, no GPU for --backend cuda, no
         sandbox where one is required, a grader failure); `python -m vramlab.grader.batch`: some rows are
         grader errors (a rerun retries them)
    5    out of memory (`measure`, `trace`)
    128+N  stopped by signal N: 129 SIGHUP, 130 SIGINT (Ctrl-C), 143 SIGTERM (kill, scancel, docker stop)
"""
from __future__ import annotations

import contextlib
import errno
import signal
import threading

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREADABLE, EXIT_GRADER, EXIT_MEMORY = 0, 1, 2, 3, 4, 5
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
SIGNAL_ZH = {"SIGINT": "Ctrl-C，SIGINT", "SIGTERM": "SIGTERM，来自 kill、scancel 或 docker stop", "SIGHUP": "SIGHUP，终端断开"}

_ERRNO_ZH = {
    errno.ENOENT: "不存在", errno.EACCES: "没有权限", errno.EPERM: "没有权限", errno.EROFS: "文件系统是只读的",
    errno.ENOSPC: "磁盘空间不足", errno.EDQUOT: "磁盘配额已用完", errno.EISDIR: "是一个文件夹，不是文件",
    errno.ENOTDIR: "路径中有一段不是文件夹（有同名的文件）", errno.EEXIST: "已经存在同名的文件",
    errno.EMFILE: "打开的文件太多", errno.ENFILE: "打开的文件太多", errno.ENOMEM: "内存不足",
    errno.EIO: "读写出错（磁盘或网络文件系统有问题）", errno.ENAMETOOLONG: "路径太长", errno.ELOOP: "符号链接层数太多",
    errno.EBUSY: "设备或资源正忙", errno.ETXTBSY: "文件正在被使用", errno.EXDEV: "不能跨文件系统改名",
    errno.ENOTEMPTY: "文件夹不是空的", errno.EFBIG: "文件太大", errno.EAGAIN: "资源暂时不可用",
    errno.EINVAL: "参数无效", errno.ECONNREFUSED: "连接被拒绝", errno.EPIPE: "管道的另一端已关闭",
}


def signal_exit_code(signum: int) -> int:
    return 128 + int(signum)


def signal_zh(signum: int) -> str:
    name = signal.Signals(signum).name
    return SIGNAL_ZH.get(name, name)


def os_error_zh(e: OSError, path: bool = True) -> str:
    """`e` in Chinese: the path (if known and `path`) and the reason, never the C library's English."""
    reason = _ERRNO_ZH.get(e.errno)
    if reason is None:
        name = errno.errorcode.get(e.errno) if isinstance(e.errno, int) else None
        reason = f"系统错误 {name}" if name else "系统错误"
    where = e.filename if path and e.filename not in (None, "") else None
    return f"{where}：{reason}" if where is not None else reason


def describe(e: BaseException) -> str:
    """An exception as a Chinese sentence for a user: no Python class name where we know the kind."""
    from concurrent.futures.process import BrokenProcessPool

    if isinstance(e, OSError):
        return os_error_zh(e)
    if isinstance(e, MemoryError):
        return "内存不足"
    if isinstance(e, BrokenProcessPool):
        return "评分的工作进程意外退出（被杀死或内存不足）"
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    text = str(e).strip()
    return text or type(e).__name__


class Interrupted(BaseException):
    """A stop signal arrived (see `stop_on_signals`). A BaseException, like KeyboardInterrupt:
    the `except Exception` of code that must never fail on a learner's doing does not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return signal_exit_code(self.signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread, once: later signals are
    only noted (the list yielded), so that the clean-up the first one started runs to its end.
    A signal this process ignores stays ignored (`nohup` ignores SIGHUP; a shell's background job,
    SIGINT). Outside the main thread (where handlers cannot be set) this does nothing."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum, frame):
        caught.append(signum)
        if len(caught) == 1:
            raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield caught
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_UNREADABLE", "EXIT_GRADER", "EXIT_MEMORY", "STOP_SIGNALS",
           "Interrupted", "describe", "os_error_zh", "signal_exit_code", "signal_zh", "stop_on_signals"]
