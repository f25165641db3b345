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
import types

from . import guards


class Harness(types.SimpleNamespace):
    """What a kind's scenario sees (`h`): the job, the device, trusted builders and call wrappers."""


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


def main(argv) -> None:
    job_path, rank, ctl_fd, status_fd = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    status = os.fdopen(status_fd, "w", buffering=1)
    _send(status, "started", pid=os.getpid())    # the parent may move this rank into its cgroup now
    result_path = os.path.join(os.path.dirname(job_path), f"result-{rank}.json")
    payload: dict = {"ok": False, "stage": "setup", "violations": [], "losses": [], "error": None}
    state = {"learner": False, "forward_calls": 0, "opt_steps": 0}
    trace = None                              # memtrace.MemTrace on the simulated device: feedback only
    violations: list[tuple[str, str]] = []

    def violate(category: str, detail: str):
        if len(violations) < 50:
            violations.append((category, detail))

    def finish():
        if trace is not None:
            try:
                payload["memory"] = trace.summary()
            except Exception:  # noqa: BLE001 - feedback never costs the result
                pass
        with open(result_path, "w", encoding="utf-8") as out:
            json.dump(payload, out, ensure_ascii=False)
        sys.stdout.flush()
        sys.stderr.flush()
        _send(status, "done")
        _wait_for(ctl_fd, b"never")          # the parent stops and kills this process
        os._exit(0)

    import torch
    import torch.nn.functional  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401  (learners use it; import it before their code)
    import torch.optim.optimizer as optim_hooks
    import torch.nn.modules.module as nn_hooks
    import transformers

    from vramlab.models import get_preset, make_config
    from .kinds import get_kind

    kind = get_kind(job["kind"])
    settings = kind.Settings(**job["settings"])
    if not kind.observed(settings):         # nobody reads this process's resident size: let glibc cache
        from . import policy
        policy.cache_freed_memory()
    if getattr(settings, "bitsandbytes", False):      # ch30 may use its 8-bit optimizers
        import bitsandbytes  # noqa: F401
    torch.set_num_threads(int(job.get("threads", 1)))
    torch.manual_seed(0)
    sim = job["backend"] == "sim"
    world = int(job.get("world_size", 1))
    if world > 1:        # the ranks meet over the sandbox's own loopback before any learner code
        import datetime
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=job["init_method"], rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(job.get("dist_timeout", 300))))
    if sim:
        from vramlab.sim.device import SimDevice
        dev = SimDevice(timeline=False, cublas_workspace=bool(getattr(settings, "cublas_workspace", True)))
    else:
        from vramlab.cuda import CudaDevice
        dev = CudaDevice()
    dev.__enter__()
    # trusted readers of the meter, bound now: the learner's code may rebind the device's methods
    reset_peak, max_allocated, max_reserved, allocated = dev.reset_peak, dev.max_allocated, dev.max_reserved, dev.allocated
    untracked, breakdown, synchronize = dev.untracked, dev.breakdown, dev.synchronize
    live = dev.tracker.live if sim else None          # which storages the simulated device holds
    families = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
                "mixtral": "MixtralForCausalLM"}
    h = Harness(job=job, settings=settings, torch=torch, dev=dev, sim=sim, payload=payload, model=None,
                violate=violate, seconds=0.0, rank=rank, world=world,
                rank_rows=lambda n: slice(rank * n // world, (rank + 1) * n // world))

    def build_model(config: dict, seed: int):
        """A seeded model of the job's preset with `config` overrides, on the device, in train mode."""
        cfg = make_config(job["model"], attention="sdpa", dropout=0.0)
        for k, v in config.items():
            setattr(cfg, k, v)
        torch.manual_seed(seed)
        with torch.device(dev.torch_device):
            model = getattr(transformers, families[get_preset(job["model"]).family])(cfg)
        return model.train()

    def training_setup():
        """The job's model (seeded) and AdamW, on the device; remembered for the guards."""
        model = build_model(job.get("config") or {}, int(job["seed"]))
        params = list(model.parameters())
        h.model = model
        payload["param_count"] = sum(p.numel() for p in params)
        # the physical floor: p, grad and 2 AdamW states on the device; fewer copies where states
        # may live in host memory (allow_host) or gradients are freed early (floor_copies)
        copies = float(getattr(settings, "floor_copies", None) or (2 if getattr(settings, "allow_host", False) else 4))
        payload["static_bytes"] = int(sum(p.numel() * p.element_size() for p in params) * copies)
        return model, torch.optim.AdamW(params, lr=float(job["lr"]), foreach=True)

    def tokens(shape, on_host: bool = False):
        """Seeded token ids: on the device, or in host memory (not device memory)."""
        gen = torch.Generator().manual_seed(int(job["seed"]) + 1)
        vocab = int((job.get("config") or {}).get("vocab_size") or get_preset(job["model"]).vocab)
        with (dev.host() if on_host else contextlib.nullcontext()):
            t = torch.randint(0, vocab, tuple(shape), generator=gen)
        return t if on_host else t.to(dev.torch_device)

    def fingerprint(params) -> list[float]:
        """Fixed random projections of every tensor (float64, on the host, off the meter). The k
        random directions are drawn once per call, a chunk at a time, and each tensor is projected
        on their leading part: far fewer random numbers to draw than k per element, and little host
        memory at any moment (the parent reads this process's high-water mark after the run).
        The directions are drawn in float32 (five times faster than float64's normal sampler) and
        the projections summed in float64. Torch function modes (the simulated device's CUDA
        emulation) are off in here: they have nothing to change in the grader's own arithmetic."""
        flats = [p.detach().reshape(-1) for p in params]
        k, chunk = int(job.get("features_k", 2)), 1 << 18
        g = torch.Generator().manual_seed(int(job.get("probe_seed", 1234)))
        with (untracked() if sim else contextlib.nullcontext()), torch.no_grad(), torch._C.DisableTorchFunction():
            sums = torch.zeros(len(flats), k, dtype=torch.float64)
            for start in range(0, max((f.numel() for f in flats), default=0), chunk):
                directions = torch.randn(k, chunk, generator=g, dtype=torch.float32).double()
                for i, flat in enumerate(flats):
                    piece = flat[start:start + chunk].cpu().double()
                    if piece.numel():
                        sums[i] += directions[:, :piece.numel()] @ piece
        return sums.reshape(-1).tolist()

    def peak() -> int:
        synchronize()
        return int(max_allocated())

    def reserved_peak() -> int:
        synchronize()
        return int(max_reserved())

    h.build_model, h.training_setup, h.tokens, h.fingerprint = build_model, training_setup, tokens, fingerprint
    h.quiet = lambda: untracked() if sim else contextlib.nullcontext()
    h.reset_peak, h.peak, h.reserved_peak = reset_peak, peak, reserved_peak
    h.gen = torch.Generator().manual_seed(int(job["seed"]) + 2)     # the scenarios' own data
    h.tracked = (lambda t: t.untyped_storage()._cdata in live) if sim else (lambda t: t.is_cuda)
    run_scenario = kind.scenario(h)
    if sim:                                   # before the meter checker: its snapshot includes the hook
        from .memtrace import MemTrace
        trace = MemTrace(dev, guards.LEARNER_FILE)

    # ---- defence in depth (guards.py); the boundary is the sandbox and the parent's observer ----
    permitted = kind.permissions(settings)
    guards.guard_device(dev, permitted, violate)
    guards.guard_torch_cuda(torch, permitted, violate)

    def forward_hook(module, args, output):
        state["forward_calls"] += 1
        if (state["learner"] and isinstance(module, torch.nn.Embedding) and args and isinstance(args[0], torch.Tensor)
                and args[0].numel() and not h.tracked(args[0])):
            violate("untracked", "模型的输入不在显存里：先用 device.to_device() 把这个 batch 搬到设备上")

    def optimizer_hook(opt, args, kwargs):
        state["opt_steps"] += 1

    nn_hooks.register_module_forward_hook(forward_hook, always_call=True)
    optim_hooks.register_optimizer_step_pre_hook(optimizer_hook)
    guards.guard_threads(violate)
    meter_replaced = guards.meter_checker(dev, torch)
    guards.install_audit_hook(state, violate)

    # ---- the parent observes this process from outside, then lets the learner's code in ----------
    from . import confine                 # the kernel's rules from here on: no process, no exec, no IPC object
    confined = confine.seccomp_deny_new_processes(sockets=world > 1)
    _send(status, "ready", pid=os.getpid(), allocated=int(allocated()), seccomp=confined)
    _wait_for(ctl_fd, b"go")
    payload["stage"] = "load"
    with open(job["source_file"], encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "submission", "__builtins__": __builtins__}
    state["learner"] = True
    try:
        exec(compile(source, guards.LEARNER_FILE, "exec"), namespace)
        fn = namespace.get(job["function"])
        if not callable(fn):
            raise NameError(job["function"])
    except SystemExit as e:
        state["learner"] = False
        payload.update(error={"kind": "exit", "message": f"代码在导入时调用了 sys.exit({e.code!r})"}, violations=violations)
        finish()
    except NameError as e:
        state["learner"] = False
        payload.update(error={"kind": "missing_function", "message": f"没有找到函数 {job['function']}：{e}"},
                       violations=violations)
        finish()
    except BaseException as e:  # noqa: BLE001 - any failure is a graded failure
        state["learner"] = False
        payload.update(error={"kind": "exception", "message": f"导入代码时出错：{type(e).__name__}: {str(e)[:500]}"},
                       violations=violations)
        finish()
    state["learner"] = False
    if getattr(settings, "MODEL_NAME", None):     # ch03: the preset of this scale, whatever the code says
        namespace["MODEL_NAME"] = settings.MODEL_NAME

    def call(thunk):
        """Run learner code (timed) with the learner's rules on."""
        state["learner"] = True
        t0 = time.perf_counter()
        try:
            return thunk()
        finally:
            state["learner"] = False
            synchronize()
            h.seconds = time.perf_counter() - t0
            replaced = meter_replaced()
            if replaced:
                violate("tamper", f"{guards.RULE_ZH['tamper']}：{'、'.join(replaced[:5])}")

    def training_call(thunk, label: str, min_steps: int = 1):
        """`call` for code that trains: it must run the model and step the optimizer."""
        fwd, opt = state["forward_calls"], state["opt_steps"]
        value = call(thunk)
        if state["forward_calls"] == fwd:
            violate("skipped_work", f"{label}没有调用模型的前向")
        if state["opt_steps"] - opt < min_steps:
            violate("skipped_work", f"{label}调用 optimizer.step() 的次数少于 {min_steps}")
        return value

    def training_result(before: list[float]) -> dict:
        return {"breakdown": dict(breakdown()) if sim else {},
                "update": [a - b for a, b in zip(fingerprint(h.model.parameters()), before)]}

    h.call, h.training_call, h.training_result = call, training_call, training_result
    if trace is not None:                     # each learner call a segment of the timeline
        h.call, h.training_call = trace.around(call), trace.around(training_call)
        trace.source_lines = source.splitlines()
    payload["stage"] = "run"
    try:
        payload.update(run_scenario(fn))
    except SystemExit as e:
        state["learner"] = False
        payload.update(error={"kind": "exit", "message": f"函数里调用了 sys.exit({e.code!r})"}, violations=violations)
        finish()
    except BaseException as e:  # noqa: BLE001
        state["learner"] = False
        message = str(e).lower()             # torch's host allocator raises RuntimeError("... can't allocate memory")
        oom = isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in message or "can't allocate memory" in message
        wrong = type(e).__name__ == "WrongAnswer"
        payload.update(error={"kind": "incorrect" if wrong else "oom" if oom else "exception",
                              "message": f"{type(e).__name__}: {str(e)[:800]}"}, violations=violations)
        finish()
    if world > 1:
        import torch.distributed as dist
        dist.barrier()                       # every rank's collectives are over before any says done
    payload.update(ok=True, stage="done", violations=violations, backend=job["backend"], torch_version=torch.__version__)
    finish()


if __name__ == "__main__":
    try:
        main(sys.argv)
    except SystemExit:
        raise
    except BaseException as exc:  # a harness failure: the parent sees no result file
        print(f"harness failure: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(70)
