"""Inside the sandbox: a warm worker that forks one harness process per rank of each grading.

    python -I -m vramlab.grader.worker SOCKET_FD [LISTEN_FD IDLE_SECONDS]

Importing torch and transformers costs several CPU-seconds, more than a small grading itself. This
process pays it once: it runs as pid 1 of a sandbox (policy.py, started by slots.py), imports
everything the harness needs, says `warm`, and then, for each job the parent sends on its socket
(with the job's pipes and output files passed as descriptors), forks the ranks. Each rank runs
harness.main() in a fresh copy of this process: no learner code has ever run in the worker itself,
so every rank starts from the same clean state a new interpreter would have, minus the imports.

Being pid 1 protects the worker from the learner: signals sent from inside its namespace to pid 1
are dropped unless pid 1 handles them. /proc is read-only in the sandbox and the worker is not
dumpable: no rank can write into its memory. The parent kills every other process of the sandbox
after each job (slots.py) and wipes its folder.

Nothing crosses gradings (confine.py): the worker keeps CAP_SYS_ADMIN inside the sandbox's user
namespace only to remount its writable folders noexec once and to enter a fresh IPC namespace
before and after every grading, so one grading's System V and POSIX objects die with its ranks.
Every rank drops all capabilities first thing after the fork. SIGTERM (from the grader, to stop
a parked worker) ends the worker once no grading is running.

Parking (LISTEN_FD): when the process that started the worker exits, it may leave the slot for the
next one (slots.py, `park`): the worker then waits on a listening unix socket, bound by that
process in a folder only its user can enter, for the next process to connect, and serves it the
same way. It ends after IDLE_SECONDS without one, and at once if its process went away without
parking it (killed: nobody will come). No rank keeps the listening socket.
"""
from __future__ import annotations

import array
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys

from . import confine

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MAX_FDS = 16
WRITABLE = ("/submission", "/tmp", "/dev/shm")


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):       # not Linux: nothing to set
        pass


def warm_up() -> None:
    """Import what every harness imports (harness.main imports them again: from sys.modules)."""
    import torch
    import torch.nn.functional  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401
    import torch.optim.optimizer  # noqa: F401
    import torch.distributed  # noqa: F401
    import transformers

    for name in ("GPT2LMHeadModel", "BertForMaskedLM", "LlamaForCausalLM", "MixtralForCausalLM"):
        getattr(transformers, name)                   # the lazy modules load here, once
    from vramlab import models  # noqa: F401
    from vramlab.sim import device  # noqa: F401
    from . import harness, kinds  # noqa: F401
    for name in kinds.KINDS:
        kinds.get_kind(name)
    try:                 # ch24-27 train peft models: ~2 s of imports that every such grading would repeat
        import peft  # noqa: F401
    except ImportError:
        pass
    try:
        _first_step(torch, transformers)
    except Exception as e:  # noqa: BLE001 - a slower first grading, not a broken worker
        print(f"worker warm-up step failed: {type(e).__name__}: {e}", file=sys.stderr)
    del torch
    # the ~450k objects of the imports, out of the collector's reach: a full gc.collect() (ch13's
    # OOM clean-up calls it after every failed trial) took 0.3 s in every rank, now ~1 ms
    gc.collect()
    gc.freeze()


def _first_step(torch, transformers) -> None:
    """One tiny training step on the simulated device. A process's first step pays for torch's
    lazy set-up (dispatch caches, autograd, the fused optimizer paths): a few tenths of a second
    that every forked rank would otherwise pay again. Trusted code, run before any learner's, on
    one thread (OMP_NUM_THREADS=1), so the ranks are forked from a process without a thread pool."""
    from vramlab.models import make_config
    from vramlab.sim.device import SimDevice

    cfg = make_config("tiny", attention="sdpa", dropout=0.0)
    cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_positions = 1, 32, 2, 64, 16
    with SimDevice(timeline=False) as dev:
        with torch.device(dev.torch_device):
            model = transformers.GPT2LMHeadModel(cfg).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        batch = torch.randint(0, cfg.vocab_size, (2, 8)).to(dev.torch_device)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _receive(sock: socket.socket):
    """One request: (JSON dict, [fds]); None when the parent is gone."""
    fds = array.array("i")
    try:
        msg, ancdata, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    except (ConnectionError, OSError):
        return None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    if not msg:
        return None
    return json.loads(msg), list(fds)


_listener: socket.socket | None = None
_isolated = False            # this sandbox gives each grading its own IPC namespace (confine.py)
_stop_requested = False


def _fresh_ipc() -> None:
    if _isolated and not confine.new_ipc_namespace():
        os._exit(72)                            # the next grading would share this one's objects


def _on_term(_signum, _frame) -> None:
    """The grader stops a parked worker with SIGTERM; mid-grading it ends after the grading."""
    global _stop_requested
    _stop_requested = True
    if not _busy:
        os._exit(0)


_busy = False


def _rank(sock: socket.socket, request: dict, rank: int, ctl: int, status: int, out: int, err: int) -> None:
    """In the forked child: limits, outputs, then the harness. Never returns."""
    code = 70
    try:
        sock.close()
        if _listener is not None:
            _listener.close()
        os.dup2(out, 1)
        os.dup2(err, 2)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from . import confine
        if not confine.drop_capabilities() and _isolated:
            os._exit(71)                        # a rank must never keep the worker's capability
        _prctl(PR_SET_DUMPABLE, 1)              # the parent reads and resets its /proc counters
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        from . import harness, policy      # already imported by warm_up: taken from sys.modules
        policy.apply_limits(int(request["memory"]), int(request["cpu_seconds"]), int(request["output_limit"]))
        harness.main(["harness", request["job"], str(rank), str(ctl), str(status)])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - a harness failure: the parent sees no result file
        try:
            print(f"harness failure: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


def _exit_fds(pids) -> list[int]:
    """A pidfd per rank (Linux 5.3+); [] where there are none: the loop then polls every 20 ms."""
    fds = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        return []
    return fds


def _status_of(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def serve(sock: socket.socket) -> bool:
    """Run the parent's jobs until it leaves: True if it parked this worker for the next process
    (slots.py, `park`), False if it just went away (killed, crashed): then the worker ends at once
    rather than idling for a claimant that will never come."""
    global _busy
    while True:
        got = _receive(sock)
        if got is None:
            return False
        request, fds = got
        if request.get("park"):
            return True
        world = int(request["world"])
        out, err = fds[2 * world], fds[2 * world + 1]
        _fresh_ipc()
        sys.stdout.flush()
        sys.stderr.flush()
        _busy = True
        ranks = {}
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                _rank(sock, request, rank, fds[2 * rank], fds[2 * rank + 1], out, err)
            ranks[pid] = rank
        for fd in fds:
            os.close(fd)
        statuses = [None] * world
        cpu = [0.0] * world             # each rank's CPU seconds: a load-independent cost (grade-bench)
        exits = _exit_fds(ranks)        # readable when a rank ends: reaped at once, not at the next poll
        try:
            while any(s is None for s in statuses):
                ready = select.select([sock, *exits], [], [], 0.5 if exits else 0.02)[0]
                if sock in ready and not sock.recv(1, socket.MSG_PEEK):
                    os._exit(0)                             # the parent is gone: pid 1 ends, and the sandbox with it
                try:
                    while True:
                        pid, wait_status, usage = os.wait4(-1, os.WNOHANG)   # also reaps orphans left to pid 1
                        if not pid:
                            break
                        if pid in ranks:
                            statuses[ranks[pid]] = _status_of(wait_status)
                            cpu[ranks[pid]] = usage.ru_utime + usage.ru_stime
                except ChildProcessError:
                    break
        finally:
            for fd in exits:
                os.close(fd)
        left = confine.ipc_objects() if _isolated else None      # the grading's, about to be dropped
        _fresh_ipc()
        sock.sendall((json.dumps({"event": "exited", "statuses": statuses, "cpu_seconds": round(sum(cpu), 3),
                                  "isolated": _isolated, "ipc_objects_dropped": left}) + "\n").encode())
        _busy = False
        if _stop_requested:
            os._exit(0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def main(argv) -> int:
    global _listener, _isolated
    sock = socket.socket(fileno=int(argv[1]))
    if len(argv) > 3:
        _listener = socket.socket(fileno=int(argv[2]))
    idle_s = float(argv[3]) if len(argv) > 3 else 0.0
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # pid 1 handles nothing a learner could send but SIGTERM
    signal.signal(signal.SIGTERM, _on_term)
    _prctl(PR_SET_DUMPABLE, 0)
    if os.environ.pop("VRAMLAB_CONFINE", "") == "1":  # bwrap gave us CAP_SYS_ADMIN for this (policy.py)
        _isolated = (confine.remount_noexec(WRITABLE) and confine.new_ipc_namespace())
        if not _isolated:       # the parent then uses this slot for one grading only (slots.py)
            print("worker: could not remount noexec / enter a new IPC namespace", file=sys.stderr)
    warm_up()
    while True:
        parked = False
        try:
            sock.sendall(b'{"event": "warm"}\n')
            parked = serve(sock)
        except OSError:
            pass
        sock.close()
        if not parked or _listener is None or not select.select([_listener], [], [], idle_s)[0]:
            return 0                                    # not parked, or nobody came: pid 1 ends, the sandbox with it
        try:
            sock, _ = _listener.accept()
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
