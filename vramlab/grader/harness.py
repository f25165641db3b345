"""The child side of the grader: ONE rank running ONE function (the starter or a learner's).

    python -I -m vramlab.grader.harness JOB.json RANK CTL_FD STATUS_FD

It runs inside the OS sandbox (policy.py), started by launch.py. Nothing in this process is
secret and nothing it writes after the learner's code has run is trusted: the parent
(sandbox.py, core.py) takes every truth from the trusted starter's run and cross-checks the
learner's reported peak with what it reads of this process from outside (observer.py).

Order of events:
1. say `started` on STATUS_FD (the parent may move this process into its memory cgroup meanwhile),
   import torch and the libraries, build the device, the model and the data (the exercise kind's
   trusted `scenario`), install the defence-in-depth guards (guards.py);
2. tell the parent `ready` on STATUS_FD (with the device bytes allocated so far: a trusted figure,
   no learner code has run) and wait for `go` on CTL_FD: the parent meanwhile reads this process's
   resident memory and resets its high-water mark;
3. compile and run the learner's code through the scenario's `run(fn)`;
4. write the result (the learner's claims) to result-RANK.json, tell the parent `done`, wait to be
   stopped. The parent reads the high-water mark before anything else can run.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from . import build, guards
from .job import Job


def _send(status, event: str, **fields) -> None:
    status.write(json.dumps(dict(fields, event=event)) + "\n")
    status.flush()


def _wait_for(ctl_fd: int, word: bytes) -> None:
    data = b""
    while not data.endswith(word):
        chunk = os.read(ctl_fd, 16)
        if not chunk:
            os._exit(0)                      # the parent is gone
        data += chunk


class Harness:
    """What a kind's scenario sees (`h`): the job, the device, trusted builders and call wrappers.

    Made before any learner code runs, and so are the meter's readers it keeps: the learner's code
    may rebind the device's methods, not these. The payload is the rank's claim (result-RANK.json).
    """

    def __init__(self, job: Job, kind, settings, dev, rank: int, status, ctl_fd: int, result_path: str):
        import torch

        self.job, self.kind, self.settings, self.torch, self.dev = job, kind, settings, torch, dev
        self.sim, self.rank, self.world = job.backend == "sim", rank, job.world_size
        self.status, self.ctl_fd, self.result_path = status, ctl_fd, result_path
        self.payload: dict = {"ok": False, "stage": "setup", "violations": [], "losses": [], "error": None}
        self.state = {"learner": False, "forward_calls": 0, "opt_steps": 0}      # read by guards' audit hook
        self.violations: list[tuple[str, str]] = []
        self.model, self.seconds, self.trace = None, 0.0, None   # trace: memtrace.MemTrace (sim), feedback only
        # trusted readers of the meter, bound now: the learner's code may rebind the device's methods
        self.reset_peak, self._max_allocated, self._max_reserved = dev.reset_peak, dev.max_allocated, dev.max_reserved
        self.allocated, self._untracked, self._breakdown = dev.allocated, dev.untracked, dev.breakdown
        self._synchronize = dev.synchronize
        self._live = dev.tracker.live if self.sim else None      # which storages the simulated device holds
        self.gen = torch.Generator().manual_seed(int(job.seed) + 2)     # the scenarios' own data

    # ---- what the scenario builds with (build.py's rules), before any learner code ----------------
    def rank_rows(self, n: int) -> slice:
        return slice(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def build_model(self, config: dict, seed: int):
        """A seeded model of the job's preset with `config` overrides, on the device, in train mode.
        Not build.build_model (vramlab.models.build_model): that one also names the loss and refuses
        unknown config keys, and the recorded runs were made with this one."""
        import transformers

        from vramlab.models import get_preset, make_config

        cfg = make_config(self.job.model, attention="sdpa", dropout=0.0)
        for k, v in config.items():
            setattr(cfg, k, v)
        self.torch.manual_seed(seed)
        with self.torch.device(self.dev.torch_device):
            model = getattr(transformers, build.FAMILIES[get_preset(self.job.model).family])(cfg)
        return model.train()

    def training_setup(self):
        """The job's model (seeded) and AdamW, on the device; remembered for the guards."""
        model = self.build_model(self.job.config or {}, int(self.job.seed))
        params = list(model.parameters())
        self.model = model
        self.payload["param_count"] = sum(p.numel() for p in params)
        self.payload["static_bytes"] = build.static_bytes(params, self.settings)
        return model, build.optimizer_for(self.job, params)

    def tokens(self, shape, on_host: bool = False):
        """Seeded token ids: on the device, or in host memory (not device memory)."""
        return build.tokens(self.job, self.dev, shape, on_host)

    def fingerprint(self, params) -> list[float]:
        """Fixed random projections of every tensor (float64, on the host, off the meter). The k
        random directions are drawn once per call, a chunk at a time, and each tensor is projected
        on their leading part: far fewer random numbers to draw than k per element, and little host
        memory at any moment (the parent reads this process's high-water mark after the run).
        The directions are drawn in float32 (five times faster than float64's normal sampler) and
        the projections summed in float64. Torch function modes (the simulated device's CUDA
        emulation) are off in here: they have nothing to change in the grader's own arithmetic."""
        torch = self.torch
        flats = [p.detach().reshape(-1) for p in params]
        k, chunk = int(self.job.features_k), 1 << 18
        g = torch.Generator().manual_seed(int(1234 if self.job.probe_seed is None else self.job.probe_seed))
        with self.quiet(), torch.no_grad(), torch._C.DisableTorchFunction():
            sums = torch.zeros(len(flats), k, dtype=torch.float64)
            for start in range(0, max((f.numel() for f in flats), default=0), chunk):
                directions = torch.randn(k, chunk, generator=g, dtype=torch.float32).double()
                for i, flat in enumerate(flats):
                    piece = flat[start:start + chunk].cpu().double()
                    if piece.numel():
                        sums[i] += directions[:, :piece.numel()] @ piece
        return sums.reshape(-1).tolist()

    # ---- the meter, read with the readers bound at start ----------------------------------------
    def quiet(self):
        """Off the simulated device's meter: the grader's own arithmetic."""
        return self._untracked() if self.sim else contextlib.nullcontext()

    def tracked(self, t) -> bool:
        """`t` lives in device memory (on the simulated device: a storage it holds)."""
        return t.untyped_storage()._cdata in self._live if self.sim else t.is_cuda

    def peak(self) -> int:
        self._synchronize()
        return int(self._max_allocated())

    def reserved_peak(self) -> int:
        self._synchronize()
        return int(self._max_reserved())

    # ---- defence in depth (guards.py); the boundary is the sandbox and the parent's observer ----
    def violate(self, category: str, detail: str) -> None:
        if len(self.violations) < 50:
            self.violations.append((category, detail))

    def install_guards(self) -> None:
        import torch.nn.modules.module as nn_hooks
        import torch.optim.optimizer as optim_hooks

        if self.sim:                          # before the meter checker: its snapshot includes the hook
            from .memtrace import MemTrace
            self.trace = MemTrace(self.dev, guards.LEARNER_FILE)
        permitted = self.kind.permissions(self.settings)
        guards.guard_device(self.dev, permitted, self.violate)
        guards.guard_torch_cuda(self.torch, permitted, self.violate)
        nn_hooks.register_module_forward_hook(self._forward_hook, always_call=True)
        optim_hooks.register_optimizer_step_pre_hook(self._optimizer_hook)
        guards.guard_threads(self.violate)
        self._meter_replaced = guards.meter_checker(self.dev, self.torch)
        guards.install_audit_hook(self.state, self.violate)

    def _forward_hook(self, module, args, output):
        self.state["forward_calls"] += 1
        if (self.state["learner"] and isinstance(module, self.torch.nn.Embedding) and args
                and isinstance(args[0], self.torch.Tensor) and args[0].numel() and not self.tracked(args[0])):
            self.violate("untracked", "模型的输入不在显存里：先用 device.to_device() 把这个 batch 搬到设备上")

    def _optimizer_hook(self, opt, args, kwargs):
        self.state["opt_steps"] += 1

    # ---- the learner's code ----------------------------------------------------------------------
    def load(self):
        """The learner's module, compiled and run; its function. A failure is the result."""
        self.payload["stage"] = "load"
        with open(self.job.source_file, encoding="utf-8") as f:
            source = f.read()
        namespace = {"__name__": "submission", "__builtins__": __builtins__}
        self.state["learner"] = True
        try:
            exec(compile(source, guards.LEARNER_FILE, "exec"), namespace)
            fn = namespace.get(self.job.function)
            if not callable(fn):
                raise NameError(self.job.function)
        except SystemExit as e:
            self.fail("exit", f"代码在导入时调用了 sys.exit({e.code!r})")
        except NameError as e:
            self.fail("missing_function", f"没有找到函数 {self.job.function}：{e}")
        except BaseException as e:  # noqa: BLE001 - any failure is a graded failure
            self.fail("exception", f"导入代码时出错：{type(e).__name__}: {str(e)[:500]}")
        self.state["learner"] = False
        if getattr(self.settings, "MODEL_NAME", None):     # ch03: the preset of this scale, whatever the code says
            namespace["MODEL_NAME"] = self.settings.MODEL_NAME
        if self.trace is not None:            # each learner call a segment of the timeline
            self.call, self.training_call = self.trace.around(self.call), self.trace.around(self.training_call)
            self.trace.source_lines = source.splitlines()
        return fn

    def call(self, thunk):
        """Run learner code (timed) with the learner's rules on."""
        return self._timed(thunk)

    def _timed(self, thunk):
        self.state["learner"] = True
        t0 = time.perf_counter()
        try:
            return thunk()
        finally:
            self.state["learner"] = False
            self._synchronize()
            self.seconds = time.perf_counter() - t0
            replaced = self._meter_replaced()
            if replaced:
                self.violate("tamper", f"{guards.RULE_ZH['tamper']}：{'、'.join(replaced[:5])}")

    def training_call(self, thunk, label: str, min_steps: int = 1):
        """`call` for code that trains: it must run the model and step the optimizer."""
        fwd, opt = self.state["forward_calls"], self.state["opt_steps"]
        value = self._timed(thunk)              # not the traced `call`: one segment per call
        if self.state["forward_calls"] == fwd:
            self.violate("skipped_work", f"{label}没有调用模型的前向")
        if self.state["opt_steps"] - opt < min_steps:
            self.violate("skipped_work", f"{label}调用 optimizer.step() 的次数少于 {min_steps}")
        return value

    def training_result(self, before: list[float]) -> dict:
        return {"breakdown": dict(self._breakdown()) if self.sim else {},
                "update": [a - b for a, b in zip(self.fingerprint(self.model.parameters()), before)]}

    def run(self, run_scenario, fn) -> None:
        """The scenario's run of the learner's function; an exception is the result."""
        self.payload["stage"] = "run"
        try:
            self.payload.update(run_scenario(fn))
        except SystemExit as e:
            self.fail("exit", f"函数里调用了 sys.exit({e.code!r})")
        except BaseException as e:  # noqa: BLE001
            message = str(e).lower()             # torch's host allocator raises RuntimeError("... can't allocate memory")
            oom = (isinstance(e, (MemoryError, self.torch.OutOfMemoryError)) or "out of memory" in message
                   or "can't allocate memory" in message)
            wrong = type(e).__name__ == "WrongAnswer"
            self.fail("incorrect" if wrong else "oom" if oom else "exception", f"{type(e).__name__}: {str(e)[:800]}")
        if self.world > 1:
            import torch.distributed as dist
            dist.barrier()                       # every rank's collectives are over before any says done
        self.payload.update(ok=True, stage="done", violations=self.violations, backend=self.job.backend,
                            torch_version=self.torch.__version__)

    # ---- the end: the claim written, `done`, and wait to be stopped -------------------------------
    def fail(self, kind: str, message: str) -> None:
        self.state["learner"] = False
        self.payload.update(error={"kind": kind, "message": message}, violations=self.violations)
        self.finish()

    def finish(self) -> None:
        if self.trace is not None:
            try:
                self.payload["memory"] = self.trace.summary()
            except Exception:  # noqa: BLE001 - feedback never costs the result
                pass
        with open(self.result_path, "w", encoding="utf-8") as out:
            json.dump(self.payload, out, ensure_ascii=False)
        sys.stdout.flush()
        sys.stderr.flush()
        _send(self.status, "done")
        _wait_for(self.ctl_fd, b"never")          # the parent stops and kills this process
        os._exit(0)


def _libraries(job: Job):
    """torch and what learners use, imported before their code; the kind and its settings."""
    import torch
    import torch.nn.functional  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401  (learners use it; import it before their code)
    import torch.optim.optimizer  # noqa: F401
    import torch.nn.modules.module  # noqa: F401
    import transformers  # noqa: F401

    import vramlab.models  # noqa: F401
    from .kinds import get_kind

    kind = get_kind(job.kind)
    settings = kind.Settings(**job.settings)
    if not kind.observed(settings):         # nobody reads this process's resident size: let glibc cache
        from . import policy
        policy.cache_freed_memory()
    if getattr(settings, "bitsandbytes", False):      # ch30 may use its 8-bit optimizers
        import bitsandbytes  # noqa: F401
    return torch, kind, settings


def _device(job: Job, settings, rank: int, torch):
    """The process group (world_size > 1) and the device, entered."""
    torch.set_num_threads(int(job.threads))
    torch.manual_seed(0)
    if job.world_size > 1:        # the ranks meet over the sandbox's own loopback before any learner code
        import datetime
        import torch.distributed as dist
        timeout = datetime.timedelta(seconds=float(300 if job.dist_timeout is None else job.dist_timeout))
        dist.init_process_group("gloo", init_method=job.init_method, rank=rank, world_size=job.world_size,
                                timeout=timeout)
    if job.backend == "sim":
        from vramlab.sim.device import SimDevice
        dev = SimDevice(timeline=False, cublas_workspace=bool(getattr(settings, "cublas_workspace", True)))
    else:
        from vramlab.cuda import CudaDevice
        dev = CudaDevice()
    dev.__enter__()
    return dev


def main(argv) -> None:
    job_path, rank, ctl_fd, status_fd = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    with open(job_path, encoding="utf-8") as f:
        job = Job.from_dict(json.load(f))
    status = os.fdopen(status_fd, "w", buffering=1)
    _send(status, "started", pid=os.getpid())    # the parent may move this rank into its cgroup now

    # 1. the libraries, the device, the model and the data (the kind's trusted scenario), the guards
    torch, kind, settings = _libraries(job)
    dev = _device(job, settings, rank, torch)
    h = Harness(job, kind, settings, dev, rank, status, ctl_fd,
                os.path.join(os.path.dirname(job_path), f"result-{rank}.json"))
    run_scenario = kind.scenario(h)
    h.install_guards()

    # 2. the parent observes this process from outside, then lets the learner's code in
    from . import confine                 # the kernel's rules from here on: no process, no exec, no IPC object
    confined = confine.seccomp_deny_new_processes(sockets=job.world_size > 1)
    _send(status, "ready", pid=os.getpid(), allocated=int(h.allocated()), seccomp=confined)
    _wait_for(ctl_fd, b"go")

    # 3. the learner's code, through the scenario's run(fn)
    fn = h.load()
    h.run(run_scenario, fn)

    # 4. the claim, `done`, and wait to be stopped
    h.finish()


if __name__ == "__main__":
    try:
        main(sys.argv)
    except SystemExit:
        raise
    except BaseException as exc:  # a harness failure: the parent sees no result file
        print(f"harness failure: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(70)
