"""The kernel's side of grading, layer by layer, without the Python guards in the way (issue 28).

- seccomp (confine.py): after the filter, every way of making a process or an object that outlives
  the process kills the process with SIGSYS; threads still work.
- memory cgroups (cgroup.py): every hiding place for memory that the resident-set reading misses
  is charged to the group a process was moved into, by the kernel, with no rule of our own.
- the warm worker's isolation: a fresh IPC namespace drops the System V objects of the last
  grading (the host's Shmem goes back), the writable folders are noexec (a native extension copied
  there does not load), and a rank keeps no capability.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vramlab.grader import cgroup, confine, policy

pytestmark = pytest.mark.slow
MiB = 2 ** 20
LINUX = sys.platform == "linux" and confine.filter_program() is not None
HIDE = 64 * MiB


def _python(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, **kw)


FILTERED = "from vramlab.grader import confine\nassert confine.seccomp_deny_new_processes()\n"
DISTRIBUTED = "from vramlab.grader import confine\nassert confine.seccomp_deny_new_processes(sockets=True)\n"
ATTEMPTS = {
    "os_fork": "import os\nos.fork()",
    "fork_exec": ("import os, _posixsubprocess\nr, w = os.pipe()\n"
                  "_posixsubprocess.fork_exec([b'/bin/true'], [b'/bin/true'], True, (w,), None, None, -1, -1, -1, -1,"
                  " -1, -1, r, w, False, False, -1, None, None, None, -1, None, False)"),
    "posix_spawn": "import os\nos.posix_spawn('/bin/true', ['/bin/true'], {})",
    "subprocess_vfork": "import subprocess\nsubprocess.run(['/bin/true'])",
    "execv": "import os\nos.execv('/bin/true', ['/bin/true'])",
    "sysv_shm": "import ctypes\nctypes.CDLL(None).shmget(0, 1 << 20, 0o1600)",
    "sysv_sem": "import ctypes\nctypes.CDLL(None).semget(0, 1, 0o1600)",
    "sysv_msg": "import ctypes\nctypes.CDLL(None).msgget(0, 0o1600)",
    "mq_open": "import ctypes\nctypes.CDLL('librt.so.1').mq_open(b'/q', 0o100 | 2, 0o600, None)",
    "keyring": "import ctypes\nctypes.CDLL(None).syscall(248, b'user', b'k', b'v', 1, -4)",   # add_key on x86_64
    "unshare": "import ctypes\nctypes.CDLL(None).unshare(0x08000000)",
    # a single rank's socket buffers would be memory cgroup v1 does not charge
    "socketpair": "import _socket\n_socket.socketpair()",
    "socket_unix": "import ctypes\nctypes.CDLL(None).socket(1, 1, 0)",
    "socket_tcp": "import _socket\n_socket.socket(2, 1)",
}


@pytest.mark.skipif(not LINUX, reason="seccomp 过滤器只支持 Linux x86_64 / aarch64")
@pytest.mark.parametrize("name", sorted(ATTEMPTS))
def test_seccomp_kills_every_route_to_a_new_process_or_ipc_object(name):
    if name == "keyring" and os.uname().machine != "x86_64":
        pytest.skip("add_key's number is x86_64's")
    r = _python(FILTERED + ATTEMPTS[name] + "\nprint('SURVIVED')")
    assert r.returncode == -signal.SIGSYS, (r.returncode, r.stdout, r.stderr[-500:])
    assert "SURVIVED" not in r.stdout


@pytest.mark.skipif(not LINUX, reason="seccomp 过滤器只支持 Linux x86_64 / aarch64")
def test_seccomp_leaves_threads_and_ordinary_work_alone():
    r = _python(DISTRIBUTED + textwrap.dedent("""
        import threading, torch, os, mmap, socket
        out = []
        t = threading.Thread(target=lambda: out.append(torch.ones(64, 64).sum().item())); t.start(); t.join()
        torch.set_num_threads(2); torch.randn(256, 256) @ torch.randn(256, 256)
        fd = os.memfd_create('x'); os.ftruncate(fd, 4096); mmap.mmap(fd, 4096)[:4] = b'abcd'
        a, b = socket.socketpair(); a.send(b'x'); assert b.recv(1) == b'x'
        print('OK', out, confine.seccomp_mode())
    """))
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split()[0] == "OK" and r.stdout.split()[-1] == "2"
    r = _python(FILTERED + "import threading, torch\nprint(torch.ones(8).sum().item())")     # a single rank's work
    assert r.returncode == 0 and r.stdout.strip() == "8.0", r.stderr[-800:]


# -- memory cgroups ---------------------------------------------------------------------------------
HIDERS = {
    "memfd_mmap_window": """
        fd = os.memfd_create('h'); os.ftruncate(fd, N)
        for i in range(0, N, 8 << 20):
            with mmap.mmap(fd, 8 << 20, offset=i) as w: w[:] = b'x' * (8 << 20)""",
    "memfd_write": """
        fd = os.memfd_create('h')
        for i in range(0, N, 1 << 20): os.write(fd, b'x' * (1 << 20))""",
    "pipes_setpipe_sz": """
        keep = []
        for i in range(N >> 20):
            r, w = os.pipe(); fcntl.fcntl(w, 1031, 1 << 20); os.set_blocking(w, False)
            os.write(w, b'x' * (1 << 20)); keep.append((r, w))""",
    "socket_buffers": """
        keep = []
        for i in range(N >> 22):
            a, b = socket.socketpair()
            a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20); b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            a.setblocking(False); sent = 0
            try:
                while sent < (4 << 20): sent += a.send(b'x' * (1 << 16))
            except BlockingIOError: pass
            keep.append((a, b, sent))""",
    "tmpfs_file": """
        fd = os.open(f'/dev/shm/vramlab-test-{os.getpid()}', os.O_CREAT | os.O_RDWR, 0o600)
        os.unlink(f'/dev/shm/vramlab-test-{os.getpid()}')
        for i in range(0, N, 1 << 20): os.write(fd, b'x' * (1 << 20))""",
    "unlinked_disk_file": """
        fd, path = tempfile.mkstemp(); os.unlink(path)
        for i in range(0, N, 1 << 20): os.write(fd, b'x' * (1 << 20))""",
    "sysv_shm": """
        libc = ctypes.CDLL(None, use_errno=True); libc.shmat.restype = ctypes.c_void_p
        sid = libc.shmget(0, ctypes.c_size_t(N), 0o1600); addr = libc.shmat(sid, None, 0)
        ctypes.memset(ctypes.c_void_p(addr), 1, N); libc.shmdt(ctypes.c_void_p(addr))
        libc.shmctl(sid, 0, None)""",
    "posix_shm": """
        import _posixshmem            # what multiprocessing.shared_memory uses, without its tracker process
        fd = _posixshmem.shm_open(f'/vramlab-test-{os.getpid()}', os.O_CREAT | os.O_RDWR, 0o600)
        _posixshmem.shm_unlink(f'/vramlab-test-{os.getpid()}'); os.ftruncate(fd, N)
        with mmap.mmap(fd, N) as w: w[:] = b'x' * N""",
}
HIDER_PRELUDE = """
import ctypes, fcntl, mmap, os, socket, sys, tempfile
N = %d
sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()
""" % HIDE


def _rss_hwm(pid: int) -> tuple[int, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


@pytest.mark.skipif(cgroup.available() is None, reason=f"不能创建内存 cgroup：{cgroup.why_not()}")
@pytest.mark.parametrize("name", sorted(HIDERS))
def test_cgroup_charges_memory_the_resident_set_misses(name):
    code = HIDER_PRELUDE + textwrap.dedent(HIDERS[name]) + "\nsys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group = cgroup.RankGroup(cgroup.available(), 4 * HIDE)
    try:
        assert proc.stdout.readline() == "ready\n"
        group.add(proc.pid)
        rss0, _ = _rss_hwm(proc.pid)
        with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
            f.write("5")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n", proc.poll()
        _, hwm = _rss_hwm(proc.pid)
        peak = group.peak()
        assert group.procs() == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
        assert group.remove()
    assert peak >= 0.9 * HIDE, f"{name}: the group saw {peak / MiB:.1f} MiB of {HIDE / MiB:.0f}"
    print(f"{name}: cgroup peak {peak / MiB:.1f} MiB, VmHWM growth {(hwm - rss0) / MiB:.1f} MiB")


SETUP_THEN_HIDE = """
import os, sys
HIDE = %d
sys.stdout.write('started\\n'); sys.stdout.flush(); sys.stdin.readline()
setup = bytearray(3 * HIDE); setup[::4096] = b'x' * len(setup[::4096]); del setup    # before ready: freed
sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()
fd = os.memfd_create('hidden')
for i in range(0, HIDE, 1 << 20): os.write(fd, b'x' * (1 << 20))
sys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.readline()
""" % HIDE


@pytest.mark.skipif(cgroup.available() is None, reason=f"不能创建内存 cgroup：{cgroup.why_not()}")
def test_a_rank_moved_in_at_started_is_charged_for_its_learner_phase_only():
    """The parent moves a rank into its group at `started` (while it builds, cgroup.py) and resets
    the group's peak at `ready`: the reading is the memory the learner's phase added (here 64 MiB
    in a memfd), not the 192 MiB the rank touched and freed before `ready`."""
    from vramlab.grader import observer

    proc = subprocess.Popen([sys.executable, "-c", SETUP_THEN_HIDE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    group = cgroup.RankGroup(cgroup.available(), 8 * HIDE)
    obs = observer.RankObservation()

    def step(word: str) -> None:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == word + "\n", proc.poll()
    try:
        assert group.resettable and proc.stdout.readline() == "started\n"
        observer.at_start(obs, os.getpid(), proc.pid, group)
        assert obs.in_group and group.procs() == [proc.pid]
        step("ready")
        assert observer.at_ready(obs, os.getpid(), proc.pid, 0, group)
        assert obs.in_group, "at ready the group's peak was reset, the rank not moved again"
        step("done")
        assert observer.at_done(obs, os.getpid(), set(), group)
    finally:
        proc.kill()
        proc.wait()
        assert group.remove()
    assert 0.9 * HIDE <= obs.cgroup_peak <= 1.5 * HIDE, f"{obs.cgroup_peak / MiB:.1f} MiB for {HIDE / MiB:.0f}"
    assert obs.cgroup_base > 0


def _shmem() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the warm worker's isolation, inside bubblewrap ------------------------------------------------
INSIDE = r"""
import ctypes, importlib.machinery, os, shutil, sys, sysconfig, time
from vramlab.grader import confine
report = {}
report['remount'] = confine.remount_noexec(('/submission', '/tmp', '/dev/shm'))
report['ipc'] = confine.new_ipc_namespace()
pid = os.fork()
if pid == 0:                      # a "grading" leaves a 64 MiB System V segment behind
    libc = ctypes.CDLL(None, use_errno=True); libc.shmat.restype = ctypes.c_void_p
    sid = libc.shmget(0, ctypes.c_size_t(64 << 20), 0o1600)
    addr = libc.shmat(sid, None, 0); ctypes.memset(ctypes.c_void_p(addr), 1, 64 << 20)
    os._exit(0)
os.waitpid(pid, 0)
report['left'] = confine.ipc_objects()
print('LEFT', flush=True); sys.stdin.readline()
confine.new_ipc_namespace()
report['after'] = confine.ipc_objects()
import _bisect
src = os.path.basename(_bisect.__file__)
shutil.copy(_bisect.__file__, '/submission/' + src)
try:
    importlib.machinery.ExtensionFileLoader('_bisect', '/submission/' + src).create_module(
        importlib.machinery.ModuleSpec('_bisect', None, origin='/submission/' + src))
    report['native'] = 'loaded'
except ImportError as e:
    report['native'] = str(e)
report['dropped'] = confine.drop_capabilities()
report['mount_after_drop'] = ctypes.CDLL(None).mount(None, b'/submission', None, 32 | 4096, None)
print(report, flush=True)
"""


@pytest.mark.skipif(policy.bwrap_path() is None, reason="没有可用的 bubblewrap")
def test_worker_isolation_drops_ipc_objects_blocks_native_code_and_capabilities(tmp_path):
    before = _shmem()
    argv = policy.bwrap_argv(tmp_path, [sys.executable, "-I", "-c", INSIDE], confine=True)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=policy.sandbox_env())
    try:
        assert proc.stdout.readline() == "LEFT\n", proc.stderr.read()[-800:]
        during = _shmem()
        proc.stdin.write("\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-1500:]
        report = eval(line)             # noqa: S307 - our own dict's repr
        proc.wait(timeout=30)
    finally:
        proc.kill()
    deadline = time.monotonic() + 5
    while _shmem() > before + 8 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert report["remount"] and report["ipc"]
    assert report["left"] == 1 and report["after"] == 0, report
    assert during >= before + 60 * MiB, "the segment should have been on the host while its namespace lived"
    assert _shmem() <= before + 8 * MiB, "the dropped namespace's segment is still on the host"
    assert report["native"] != "loaded" and "failed to map segment" in report["native"], report["native"]
    assert report["dropped"] and report["mount_after_drop"] != 0
