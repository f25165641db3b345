"""The grading sandbox's policy: what learner code can see, write and reach.

Learner code runs under bubblewrap (`bwrap`), in its own user, pid, network, ipc, uts and cgroup
namespaces, with no capabilities and no way to make new user namespaces. Its whole view of the
file system is built here, from nothing:

- read-only: the system (/usr and its /bin, /lib links), a few files of /etc, the Python
  installation, and the vramlab package with its `exercises/` folder (the specs: their hidden
  cases) covered by an empty tmpfs;
- writable: the grading's own folder (`/submission`, the cwd) and a private /tmp and /dev/shm
  inside it;
- /proc is the sandbox's own, read-only (the learner cannot reset its own peak-memory counter
  through /proc/self/clear_refs); on a GPU the NVIDIA device nodes are passed through.

The course directory, solutions/, tests/, the gradebook, other submissions and other gradings are
not mounted: they are absent, not merely refused. No network: the ranks of a 2-process exercise
share one sandbox and talk over its private loopback.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent           # .../vramlab
HIDDEN_IN_PACKAGE = ("exercises",)                              # the specs hold the hidden cases
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/nsswitch.conf",
             "/etc/passwd", "/etc/group", "/etc/hosts")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SUBMISSION_DIR = "/submission"                                  # the grading's folder, as the learner sees it


@functools.lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    """bwrap if it is installed and can create the namespaces here (not in every container)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        probe = subprocess.run([path, *_system_mounts(), "--unshare-all", "--unshare-user", "--disable-userns",
                                "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "true"],
                               capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if probe.returncode == 0 else None


def _system_mounts() -> list[str]:
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):                       # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for f in ETC_FILES:
        if os.path.exists(f):
            args += ["--ro-bind", f, f]
    return args


def python_roots() -> list[str]:
    """The Python installation the harness runs on: interpreter, standard library, site-packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if sysconfig.get_paths().get(key):
            roots.add(sysconfig.get_paths()[key])
    real = sorted({os.path.realpath(r) for r in roots} | roots)
    # a root inside another is already mounted with it
    return [r for r in real if os.path.isdir(r) and not any(r != o and r.startswith(o + os.sep) for o in real)]


def _ro_bind_real(path: str) -> list[str]:
    """Bind `path` read-only; where it is a symlink, recreate the link and bind its target."""
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path] + _ro_bind_real(os.path.realpath(path))
    return ["--ro-bind", path, path]


def gpu_mounts() -> list[str]:
    args: list[str] = []
    for node in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", node, node]
    if args and os.path.isdir("/sys"):
        args += ["--ro-bind", "/sys", "/sys"]      # the CUDA driver reads PCI topology
    return args


def bwrap_argv(workdir: str | os.PathLike, command: list[str], gpu: bool = False, network: bool = False,
               extra_binds: tuple[str, ...] = (), die_with_parent: bool = True, confine: bool = False) -> list[str]:
    """The full command line: `command` run in the sandbox with `workdir` as /submission.
    `network=True` keeps the host's network namespace (a Jupyter kernel must reach its client's
    ZeroMQ ports); `extra_binds` are further paths bound read-only at the same place. A warm
    worker (slots.py) is started without `--die-with-parent`, which would tie it to the thread
    that started it: it ends when its socket to the parent closes. `confine=True` keeps
    CAP_SYS_ADMIN inside the sandbox's user namespace for its first process (the warm worker or
    launch.py), which remounts the writable folders noexec and gives each grading a fresh IPC
    namespace, then drops it in every rank before learner code (confine.py); the environment
    variable VRAMLAB_CONFINE=1 tells that process to do so."""
    workdir = Path(workdir)
    for sub in ("tmp", "shm"):
        (workdir / sub).mkdir(exist_ok=True)
    args = [bwrap_path() or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--new-session", "--as-pid-1", *_system_mounts()]
    if die_with_parent:
        args.insert(6, "--die-with-parent")
    if confine:
        args[args.index("ALL") + 1:args.index("ALL") + 1] = ["--cap-add", "CAP_SYS_ADMIN"]
    if network:
        args.insert(2, "--share-net")
    # the private /tmp first: a course (and its venv) under /tmp is then bound on top of it, not hidden by it
    args += ["--bind", str(workdir / "tmp"), "/tmp"]
    for root in python_roots():
        args += _ro_bind_real(root)
    if not any(str(PACKAGE_DIR).startswith(r + os.sep) for r in python_roots()):
        args += ["--ro-bind", str(PACKAGE_DIR), str(PACKAGE_DIR)]       # an editable install
    for name in HIDDEN_IN_PACKAGE:
        if (PACKAGE_DIR / name).is_dir():
            args += ["--tmpfs", str(PACKAGE_DIR / name), "--remount-ro", str(PACKAGE_DIR / name)]
    for path in extra_binds:
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
    if gpu:
        args += gpu_mounts()
    # writable: only the grading's own folder; /tmp and /dev/shm are folders in it, so that what
    # is written there is on disk and counted by the observer as written bytes, not hidden memory
    args += ["--bind", str(workdir), SUBMISSION_DIR, "--bind", str(workdir / "shm"), "/dev/shm",
             "--remount-ro", "/", "--chdir", SUBMISSION_DIR, "--"]
    return args + command


def apply_limits(memory: int, cpu_seconds: int, output_limit: int) -> None:
    """The resource limits of a learner's process: no core file, bounded file size, CPU time and
    address space (set in the process itself, before learner code; inherited by its children)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_limit, output_limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (ValueError, OSError):
        pass


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3          # glibc's mallopt() parameters


def cache_freed_memory() -> None:
    """Undo sandbox_env's malloc settings in a process whose memory the observer does not judge
    (its kind's `observed()` is False: host memory is allowed there, or a failed trial's tensors
    already sit in RAM). Freed buffers then stay in glibc's heap and are reused, instead of being
    unmapped and faulted in again, zeroed, page by page at the next allocation (ch07's reference
    step: 3.2 CPU-s with the sandbox's settings, 1.9 s without; scripts/probes/malloc_regime.py).
    Observed kinds keep paying it: with glibc's cache their honest runs read 35-94 MiB above the
    starter's, past the observer's tolerance. Thresholds as glibc's largest defaults."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 * 2 ** 20)
    except (OSError, AttributeError):       # not glibc: nothing to undo
        pass


def sandbox_env(gpu: bool = False) -> dict[str, str]:
    """The child's whole environment: nothing inherited but the GPU selection."""
    env = {
        "PATH": "/usr/bin:/bin", "HOME": SUBMISSION_DIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "USER": "learner",
        "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
        "XDG_CACHE_HOME": SUBMISSION_DIR + "/.cache", "TORCHINDUCTOR_CACHE_DIR": SUBMISSION_DIR + "/.inductor",
        "PYTHONIOENCODING": "utf-8", "TOKENIZERS_PARALLELISM": "false",
        # large buffers are mmapped and unmapped on free: the resident size the observer reads
        # follows the live tensors instead of glibc's cached heap
        "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
        # ...and torch aligns buffers of 2 MiB or more to 2 MiB and asks for transparent huge
        # pages: a fault per 2 MiB instead of per 4 KiB (ch07's reference step: 40% fewer faults,
        # 10-30% less CPU; scripts/probes/malloc_regime.py). Where THP is off, nothing changes.
        "THP_MEM_ALLOC_ENABLE": "1",
    }
    if gpu:
        for k in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
            if k in os.environ:
                env[k] = os.environ[k]
    return env


NO_SANDBOX_WARNING = ("⚠ 这台机器上没有可用的 bubblewrap（bwrap）沙箱：学员代码将只在普通子进程里运行，"
                      "只有 Python 层面的防护。自测结果可以参考，但不能作为正式成绩。"
                      "在 Linux 上安装：sudo apt-get install bubblewrap")
IN_KERNEL_SANDBOX_NOTE = ("ℹ 这次检查在 nbgrader 评分沙箱的 kernel 里运行：学员代码和这次评分在同一个沙箱里，"
                          "进程外的显存读数不可用；正式成绩以教师在 kernel 之外的复评（scripts/grade_class.sh）为准。")
NO_SANDBOX_REFUSAL = ("没有可用的 bubblewrap（bwrap）沙箱，拒绝批量评分：学员代码必须在操作系统沙箱里运行。"
                      "请在 Linux 上安装 bubblewrap（sudo apt-get install bubblewrap）；"
                      "确实要在没有沙箱的情况下评分，请加 --no-sandbox（只在信任提交者时这样做）")
