"""Kernel-enforced rules for a rank, set by trusted code inside the sandbox before learner code runs.

Python-level guards (guards.py) see only what CPython raises an audit event for; a learner who
calls `_posixsubprocess.fork_exec`, loads a native extension, or issues a raw syscall walks past
them. These rules are the kernel's, and no code in the process can lift them once set:

- `seccomp_deny_new_processes()`: a seccomp filter that kills the whole process (SIGSYS) on any
  attempt to make a process or run a program (fork, vfork, clone without CLONE_THREAD, execve),
  to reach another process (ptrace, process_vm_*), or to make an object that outlives the process
  (System V shared memory, semaphores, message queues, POSIX message queues, keyrings), and, for
  a single-rank job, to make a socket: it has no use for one, and without this rule only the
  Python guard's audit event would stand between learner code and kernel buffers to park data in
  (the memory cgroup charges them, tests/test_confine.py) or an abstract unix socket to talk to.
  Ranks of a distributed job keep sockets: gloo talks over them. Threads
  are allowed (clone with CLONE_THREAD); clone3 answers ENOSYS so that glibc falls back to clone,
  whose flags a filter can read. The parent reads the rank's death by SIGSYS as a violation.
- `new_ipc_namespace()`: the warm worker (worker.py) moves into a fresh IPC namespace before each
  grading and again after it, so the System V and POSIX objects of one grading vanish with its
  ranks and the next grading starts in an empty namespace.
- `remount_noexec()`: the writable folders (/submission, /tmp, /dev/shm) are remounted noexec,
  nosuid, nodev: an ELF written there cannot be mapped executable, hence not dlopen()ed.
- `drop_capabilities()`: the worker keeps CAP_SYS_ADMIN inside the sandbox's user namespace for
  the two calls above; every rank drops all capabilities (bounding set included) before anything
  else, so the learner can neither remount nor leave the namespaces.

Linux only (x86_64, aarch64); elsewhere each function returns False and the grader says the run
had only the sandbox's other protections.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct

PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
CLONE_NEWIPC, CLONE_NEWNS, CLONE_THREAD = 0x08000000, 0x00020000, 0x00010000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 2, 4, 8, 32, 4096
ENOSYS = 38

RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x35, 0x06

# (audit arch, {name: number}); names not on an architecture (fork on aarch64) are simply absent
ARCHES = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone": 56, "clone3": 435,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
        "add_key": 248, "request_key": 249, "keyctl": 250, "seccomp": 317, "setns": 308, "unshare": 272,
        "socket": 41, "socketpair": 53}),
    "aarch64": (0xC00000B7, {
        "execve": 221, "execveat": 281, "clone": 220, "clone3": 435,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
        "add_key": 217, "request_key": 218, "keyctl": 219, "seccomp": 277, "setns": 268, "unshare": 97,
        "socket": 198, "socketpair": 199}),
}
KILLED = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
          "shmget", "semget", "msgget", "mq_open", "add_key", "request_key", "keyctl", "setns", "unshare")
SOCKETS = ("socket", "socketpair")          # killed too unless the job is distributed
REASON_ZH = ("评分进程调用了评分时禁止的系统调用，被内核终止（SIGSYS）：评分期间不允许创建进程、执行程序、"
             "访问别的进程，也不允许创建活得比进程更久的对象（System V / POSIX 进程间通信、密钥环）；"
             "单进程的题也不允许创建套接字")


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None, sockets: bool = False) -> bytes | None:
    """The BPF program (bytes of `struct sock_filter`) for this machine, None if unsupported;
    `sockets=True` lets socket() and socketpair() through (the ranks of a distributed job)."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    arch, numbers = ARCHES[machine]
    prog = [_insn(BPF_LD_W_ABS, 0, 0, 4),                # seccomp_data.arch
            _insn(BPF_JEQ_K, 1, 0, arch),
            _insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),     # another ABI (int 0x80 on x86_64): no
            _insn(BPF_LD_W_ABS, 0, 0, 0)]                 # seccomp_data.nr
    if machine == "x86_64":                               # the x32 ABI's numbers
        prog += [_insn(BPF_JGE_K, 0, 1, 0x40000000), _insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    for name in KILLED + (() if sockets else SOCKETS):
        if name in numbers:
            prog += [_insn(BPF_JEQ_K, 0, 1, numbers[name]), _insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    prog += [_insn(BPF_JEQ_K, 0, 1, numbers["clone3"]), _insn(BPF_RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    prog += [_insn(BPF_JEQ_K, 0, 4, numbers["clone"]),
             _insn(BPF_LD_W_ABS, 0, 0, 16),               # args[0]: the clone flags (low 32 bits)
             _insn(BPF_JSET_K, 0, 1, CLONE_THREAD),
             _insn(BPF_RET_K, 0, 0, RET_ALLOW),
             _insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    prog.append(_insn(BPF_RET_K, 0, 0, RET_ALLOW))
    return b"".join(prog)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_deny_new_processes(sockets: bool = False) -> bool:
    """Install the filter on every thread of this process (TSYNC); True if it is in force."""
    libc, program = _libc(), filter_program(sockets=sockets)
    if libc is None or program is None:
        return False
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    nr = ARCHES[platform.machine()][1]["seccomp"]
    if libc.syscall(nr, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog)) == 0:
        return True
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def seccomp_mode(pid: int | str = "self") -> int | None:
    """2 when a filter is in force for `pid` (from /proc/PID/status), None if unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def drop_capabilities() -> bool:
    """Drop every capability: bounding set, ambient, effective, permitted, inheritable."""
    libc = _libc()
    if libc is None:
        return False
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 40
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)        # EPERM without CAP_SETPCAP: then none to drop
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("Ii", 0x20080522, 0)            # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)                                     # two empty __user_cap_data_struct
    libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data))
    return effective_capabilities() == 0


def effective_capabilities(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return None


def new_ipc_namespace() -> bool:
    libc = _libc()
    return libc is not None and libc.unshare(CLONE_NEWIPC) == 0


def remount_noexec(paths) -> bool:
    """Remount each (bind-mounted) path noexec, nosuid, nodev, keeping it writable. The mounts
    are bwrap's, in a mount namespace our user namespace may not own: first a mount namespace of
    our own (its copies of the mounts may gain flags, never lose them)."""
    libc = _libc()
    if libc is None or libc.unshare(CLONE_NEWNS) != 0:
        return False
    ok = True
    for path in paths:
        if not os.path.isdir(path):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_NOEXEC | MS_NOSUID | MS_NODEV
        ok = libc.mount(None, os.fsencode(path), None, flags, None) == 0 and ok
    return ok


def ipc_objects() -> int:
    """System V objects in this process's IPC namespace (/proc/sysvipc lists the reader's)."""
    count = 0
    for name in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{name}", encoding="ascii") as f:
                count += max(0, len(f.readlines()) - 1)
        except OSError:
            pass
    return count
