"""Defence in depth inside the learner's process: Python-level rules with Chinese feedback.

These are NOT the security boundary (Python audit hooks are documented as not being a sandbox,
and everything here lives in the interpreter the learner's code runs in). The boundary is the OS
sandbox (policy.py) and the parent's own measurement (observer.py). What these guards add is
early, readable feedback for the honest mistakes and the lazy cheats: starting processes or
threads, opening sockets, importing the exercise specs, resetting the peak in the middle of a
step, emptying the cache where an exercise forbids it, moving memory off the meter.
"""
from __future__ import annotations

import os
import sys

LEARNER_FILE = "<submission>"          # the filename the learner's code is compiled under
WRITABLE = ("/submission", "/tmp", "/dev/shm")          # the sandbox's only writable places
COURSE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_ROOT = os.path.join(COURSE_ROOT, "vramlab")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
PATH_WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                     "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
INTROSPECTION_EVENTS = {"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                        "gc.get_referents"}

DENIED_EVENTS = {
    "subprocess.Popen": "fork", "os.system": "fork", "os.exec": "fork", "os.posix_spawn": "fork",
    "os.spawn": "fork", "os.fork": "fork", "os.forkpty": "fork", "pty.spawn": "fork",
    "_thread.start_new_thread": "thread", "socket.__new__": "network", "socket.connect": "network",
    "socket.bind": "network", "os.kill": "signal", "os.killpg": "signal", "signal.pthread_kill": "signal",
    "sys.addaudithook": "introspection",
}
DEVICE_RULES = {      # device method -> the violation it records when the learner calls it directly
    "reset_peak": "reset_peak", "reset_peak_memory_stats": "reset_peak", "empty_cache": "empty_cache",
    "host": "host", "to_host": "host",
    "save_on_cpu": "host", "untracked": "untracked", "adopt": "untracked", "set_budget": "untracked",
}
RULE_ZH = {
    "fork": "启动了子进程", "thread": "启动了新线程", "network": "打开了网络连接", "signal": "向进程发送了信号",
    "introspection": "读取了解释器内部（栈帧、gc 对象表或审计钩子）", "native": "用 ctypes 调用了原生代码",
    "filesystem": "试图写入评分文件夹之外的文件", "forbidden_read": "试图读取课程目录（参考答案、测试、成绩库）",
    "tamper": "替换了计量器或 torch 的显存函数", "forbidden_import": "导入了练习规格（参考答案）",
    "reset_peak": "在函数里重置了峰值统计", "empty_cache": "调用了 empty_cache()",
    "host": "把张量放到了不计显存的主存里（本题不允许卸载到主存）", "untracked": "调用了不计显存的设备接口",
}


def learner_is_caller(depth: int = 2) -> bool:
    """Is the code `depth` frames up the learner's own (not torch's, not the harness's)? Code with
    no file behind it counts as the learner's: `exec` under a faked module name is the learner's too."""
    try:
        filename = sys._getframe(depth).f_code.co_filename
    except ValueError:
        return False
    return filename == LEARNER_FILE or filename.startswith("<")


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _path_rule(event: str, args) -> str | None:
    """Writes outside the writable places and reads of the course tree (absent in the sandbox
    anyway: this only names the attempt)."""
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS)
        paths = [path]
    elif event in PATH_WRITE_EVENTS:
        writing, paths = True, list(args)
    elif event in ("os.listdir", "os.scandir"):
        writing, paths = False, list(args[:1])
    else:
        return None
    for p in paths:
        if not isinstance(p, (str, bytes, os.PathLike)):
            continue
        real = os.path.realpath(os.fsdecode(os.fspath(p)))
        if writing and not _under(real, WRITABLE):
            return "filesystem"
        if _under(real, [COURSE_ROOT]) and (not _under(real, [PACKAGE_ROOT, os.path.join(COURSE_ROOT, ".venv")])
                                            or _under(real, [os.path.join(PACKAGE_ROOT, "exercises")])):
            return "forbidden_read"
    return None


def install_audit_hook(state: dict, violate) -> None:
    """Refuse process creation, threads, sockets, signals, introspection, native code, writes
    outside the folder and spec imports while learner code runs."""
    busy = [False]                    # the hook's own sys._getframe raises an event too

    def audit(event, args):
        if not state["learner"] or busy[0]:
            return
        busy[0] = True
        try:
            category = DENIED_EVENTS.get(event)
            if event == "import" and args and isinstance(args[0], str) and args[0].startswith("vramlab.exercises"):
                category = "forbidden_import"
            elif event.startswith("ctypes.") and any(learner_is_caller(d) for d in range(2, 6)):
                category = "native"      # the learner's own ctypes; bitsandbytes' native calls are its business
            elif event in INTROSPECTION_EVENTS and learner_is_caller(2):
                category = "introspection"     # libraries look at their own callers; the learner may not
            elif category is None:
                category = _path_rule(event, args)
        finally:
            busy[0] = False
        if category is None:
            return
        violate(category, f"{RULE_ZH[category]}（{event}）")
        raise PermissionError(f"评分沙箱：不允许 {event}")
    sys.addaudithook(audit)


def guard_threads(violate) -> None:
    """Python 3.11 raises no audit event for new threads: wrap the functions that start them."""
    import _thread
    import threading

    def guarded(*args, _original=_thread.start_new_thread, **kwargs):
        if any(learner_is_caller(d) for d in range(2, 5)):
            violate("thread", RULE_ZH["thread"])
            raise PermissionError("评分沙箱：不允许启动线程")
        return _original(*args, **kwargs)
    _thread.start_new_thread = guarded
    if hasattr(threading, "_start_new_thread"):
        threading._start_new_thread = guarded
    if hasattr(threading, "_start_joinable_thread"):
        original = threading._start_joinable_thread

        def guarded_joinable(*args, _original=original, **kwargs):
            if any(learner_is_caller(d) for d in range(2, 5)):
                violate("thread", RULE_ZH["thread"])
                raise PermissionError("评分沙箱：不允许启动线程")
            return _original(*args, **kwargs)
        threading._start_joinable_thread = guarded_joinable


def meter_checker(dev, torch):
    """A function that names the meter functions the learner replaced since now (the device's class
    and instance, torch.cuda's memory functions); the trusted readers are bound already, so this is
    feedback, not protection."""
    cls = type(dev)
    before_cls = dict(vars(cls))
    before_inst = dict(vars(dev))
    cuda_names = ("max_memory_allocated", "memory_allocated", "max_memory_reserved", "memory_reserved",
                  "memory_stats", "reset_peak_memory_stats")
    before_cuda = {n: getattr(torch.cuda, n, None) for n in cuda_names}

    def replaced() -> list[str]:
        bad = [f"{cls.__name__}.{n}" for n, v in vars(cls).items() if before_cls.get(n) is not v]
        bad += [f"device.{n}" for n, v in vars(dev).items() if callable(v) and before_inst.get(n) is not v]
        bad += [f"torch.cuda.{n}" for n in cuda_names if getattr(torch.cuda, n, None) is not before_cuda[n]]
        return bad
    return replaced


def guard_device(dev, permitted: frozenset, violate) -> None:
    """Wrap the device's public methods that change what the meter counts: a direct call from the
    learner's code is recorded (unless the exercise permits it); trusted harness code and the
    libraries the learner calls are not affected."""
    for name, category in DEVICE_RULES.items():
        if category in permitted or not hasattr(dev, name):
            continue
        original = getattr(dev, name)

        def guarded(*args, _original=original, _category=category, _name=name, **kwargs):
            if learner_is_caller():
                violate(_category, f"{RULE_ZH[_category]}：device.{_name}()")
            return _original(*args, **kwargs)
        setattr(dev, name, guarded)


def guard_torch_cuda(torch, permitted: frozenset, violate) -> None:
    """The same rule for torch.cuda's peak and cache functions (on a real GPU)."""
    for name in ("reset_peak_memory_stats", "reset_max_memory_allocated", "empty_cache"):
        category = "empty_cache" if name == "empty_cache" else "reset_peak"
        if category in permitted or not hasattr(torch.cuda, name):
            continue
        original = getattr(torch.cuda, name)

        def guarded(*args, _original=original, _category=category, _name=name, **kwargs):
            if learner_is_caller():
                violate(_category, f"{RULE_ZH[_category]}：torch.cuda.{_name}()")
            return _original(*args, **kwargs)
        setattr(torch.cuda, name, guarded)
