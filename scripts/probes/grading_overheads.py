"""Probe behind README's figures on what a grading spends besides the learner's own arithmetic
(issue 14). Three parts, on one thread:

    .venv/bin/python scripts/probes/grading_overheads.py profile [EXERCISE ...]   (default: all 1-rank)
    .venv/bin/python scripts/probes/grading_overheads.py modes
    .venv/bin/python scripts/probes/grading_overheads.py fork

profile: cProfile of each reference's visible case in a forked child of a warm worker, under the
    sandbox's malloc settings (malloc_regime.child); prints, summed over the exercises, the seconds
    in harness.main, in the grader's fingerprint() and in its torch.randn draws.
modes:   one training step of stage1-challenge's CI model (micro-batch of 32 rows, sequence 128),
    milliseconds per step (process CPU, best of 5): plain PyTorch, under a no-op dispatch mode and
    a no-op function mode (what any Python mode costs), and on the simulated device.
fork:    fork + exit of a warm worker (worker.warm_up()), milliseconds, before and after collapsing
    its anonymous memory into transparent huge pages (madvise MADV_HUGEPAGE + MADV_COLLAPSE), and
    what a forked child running ch05's and ch07's reference (visible case, sandbox malloc settings)
    costs then: the child's CPU plus the worker's for the fork, best of 3.
"""
import contextlib
import cProfile
import ctypes
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import malloc_regime  # noqa: E402

MADV_HUGEPAGE, MADV_COLLAPSE, HUGE = 14, 25, 1 << 21


def profile(exercises: list[str]) -> None:
    if any(os.environ.get(k) != v for k, v in malloc_regime.FLAGS.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **malloc_regime.FLAGS})
    from vramlab.grader import worker

    worker.warm_up()
    if not exercises:
        from vramlab.exercises import EXERCISES
        exercises = [s.id for s in EXERCISES.values() if s.ci.settings.world_size == 1]
    out = tempfile.mkdtemp(prefix="vramlab-profile-")
    totals = {"main": 0.0, "fingerprint": 0.0, "randn": 0.0}
    for exercise in exercises:
        path = os.path.join(out, f"{exercise}.prof")
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            profiler = cProfile.Profile()

            def stop(fd, word):
                if word == b"never":            # the harness is done: keep the profile, exit
                    profiler.disable()
                    profiler.dump_stats(path)
                    os._exit(0)
            profiler.enable()
            malloc_regime.child(exercise, cached=False, wait_for=stop)
            os._exit(0)
        os.waitpid(pid, 0)
        for (filename, _, name), (_, _, _, cumulative, callers) in pstats.Stats(path).stats.items():
            if name in ("main", "fingerprint") and filename.endswith("grader/harness.py"):
                totals[name] += cumulative
            elif "randn" in name and any(c[2] == "fingerprint" for c in callers):
                totals["randn"] += callers[next(c for c in callers if c[2] == "fingerprint")][3]
    print(f"{len(exercises)} references, visible case: harness.main {totals['main']:.2f} s, fingerprint() "
          f"{totals['fingerprint']:.2f} s ({totals['fingerprint'] / totals['main']:.1%}), its torch.randn "
          f"{totals['randn']:.2f} s ({totals['randn'] / totals['main']:.1%}); profiles in {out}")


def modes() -> None:
    import torch
    import transformers
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from vramlab.exercises import get_exercise
    from vramlab.models import make_config
    from vramlab.sim.device import SimDevice

    class NoDispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class NoFunction(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(1)
    config = get_exercise("stage1-challenge").ci.settings.config

    def setup():
        cfg = make_config("tiny", attention="sdpa", dropout=0.0)
        for k, v in config.items():
            setattr(cfg, k, v)
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg).train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True), torch.randint(0, 8, (32, 128))

    def per_step(model, opt, x, context) -> float:
        def steps(n):
            for _ in range(n):
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        best = float("inf")
        for _ in range(5):
            with context():
                steps(2)
                t0 = time.process_time()
                steps(20)
                best = min(best, (time.process_time() - t0) / 20)
        return best * 1000

    model, opt, x = setup()
    print(f"plain {per_step(model, opt, x, contextlib.nullcontext):.2f} ms/step")
    print(f"no-op dispatch mode {per_step(model, opt, x, NoDispatch):.2f} ms/step")
    print(f"no-op function mode {per_step(model, opt, x, NoFunction):.2f} ms/step")

    def both():
        stack = contextlib.ExitStack()
        stack.enter_context(NoFunction())
        stack.enter_context(NoDispatch())
        return stack
    print(f"both no-op modes {per_step(model, opt, x, both):.2f} ms/step")
    with SimDevice(timeline=False, cublas_workspace=False) as dev:
        with torch.device(dev.torch_device):
            model, opt, x = setup()
        x = x.to(dev.torch_device)
        print(f"simulated device {per_step(model, opt, x, contextlib.nullcontext):.2f} ms/step")


def fork() -> None:
    if any(os.environ.get(k) != v for k, v in malloc_regime.FLAGS.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **malloc_regime.FLAGS})
    from vramlab.grader import worker

    worker.warm_up()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def fork_exit_ms(n=20) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        return (time.perf_counter() - t0) / n * 1000

    def anon() -> str:
        with open("/proc/self/status") as f:
            return next(line.split(":")[1].strip() for line in f if line.startswith("RssAnon"))

    def grading_cpu(exercise: str) -> float:
        best = float("inf")
        for _ in range(3):
            before = os.times()
            pid = os.fork()
            if pid == 0:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
                malloc_regime.child(exercise, cached=False)
                os._exit(0)
            forked = os.times()
            _, _, usage = os.wait4(pid, 0)
            parent = forked.user + forked.system - before.user - before.system
            best = min(best, usage.ru_utime + usage.ru_stime + parent)
        return best

    def report(what: str) -> None:
        print(f"{what}: fork + exit {fork_exit_ms():.1f} ms; "
              + ", ".join(f"{e} {grading_cpu(e):.2f} CPU-s" for e in ("ch05-accumulation", "ch07-checkpoint")))

    report(f"warm worker, anonymous {anon()}")
    collapsed = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if "rw" not in parts[1] or (len(parts) > 5 and not parts[5].startswith("[heap")):
                continue                                   # private anonymous memory and the heap only
            lo, hi = (start + HUGE - 1) & ~(HUGE - 1), end & ~(HUGE - 1)
            if hi - lo >= HUGE:
                libc.madvise(lo, hi - lo, MADV_HUGEPAGE)
                if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
                    collapsed += hi - lo
    report(f"after collapsing {collapsed >> 20} MiB into huge pages")


if __name__ == "__main__":
    part, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    {"profile": lambda: profile(args), "modes": modes, "fork": fork}.get(part, lambda: sys.exit(__doc__))()
