"""The child side of the grader: runs ONE function (the starter or a learner's) in a fresh process.

    python -I -m vramlab.grader.harness JOB.json KEY_FD

The parent (vramlab.grader.core) starts it with resource limits, a scrubbed environment, a fresh
temporary working directory and a secret on file descriptor KEY_FD. This module never imports
`vramlab.exercises`: the job file carries only the workload sizes and the path of the code to run.

Order of events (the order is the defence):
1. read the secret from KEY_FD and close it;
2. import torch / transformers / the meter and capture the meter's functions (objects and
   `__code__`), the dispatch and function mode stacks, torch's memory functions;
3. open the device, build model, optimizer and batches (seeded) inside it;
4. install guards: counting wrappers on every peak-reset / cache-emptying / untracked-memory entry
   point, a guarded tracker class whose `paused`/`host` counters record who changes them, wrappers
   on the mode-stack pop functions, a global module-forward hook that checks the tracker is on the
   dispatch stack at every module call, an optimizer pre-step hook that checks every gradient is a
   tracked storage, and a `sys.addaudithook` hook (cannot be removed from Python) that forbids
   writes outside the working directory, reading the course tree, processes, sockets, ctypes,
   gc/frame introspection and new threads;
5. only then compile and run the learner's code: warm-up steps, reset the peak with the captured
   original, measured steps; invariants are re-checked after every step;
6. write the result (JSON) signed with HMAC-SHA256 under the secret, and leave with os._exit.

Residual risk (documented for instructors): the learner's code runs in this interpreter, so in
principle it can reach anything here (e.g. through a frame object obtained before a guard fires,
or a C extension it manages to load). The backstops outside this process are the correctness check
against the starter's losses and parameter updates computed in a separate trusted process, and a
physical lower bound on the peak (parameters + gradients + optimizer state of the trusted run).
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import sys
import time
import types

from .scenarios import SCENARIOS, WrongAnswer


def _sign(key: bytes, payload: dict) -> dict:
    body = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    return {"payload": body, "mac": hmac.new(key, body.encode(), hashlib.sha256).hexdigest()}


def _code_objects(modules) -> set:
    """Every code object defined in these modules: functions, methods, properties, nested code."""
    found: set = set()

    def walk(co):
        if co not in found:
            found.add(co)
            for c in co.co_consts:
                if isinstance(c, types.CodeType):
                    walk(c)

    def visit(obj):
        obj = getattr(obj, "__func__", obj)                       # staticmethod / classmethod
        while hasattr(obj, "__wrapped__"):                          # contextmanager, functools.wraps
            code = getattr(obj, "__code__", None)
            if code is not None:
                walk(code)
            obj = obj.__wrapped__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f)
        elif isinstance(getattr(obj, "__code__", None), types.CodeType):
            walk(obj.__code__)

    for mod in modules:
        for value in list(vars(mod).values()):
            if isinstance(value, type) and value.__module__ == mod.__name__:
                for member in list(vars(value).values()):
                    visit(member)
            elif getattr(value, "__module__", None) == mod.__name__:
                visit(value)
    return found


def main(argv) -> None:  # noqa: C901 - one linear story, kept in one place on purpose
    job_path, key_fd = argv[1], int(argv[2])
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    key = b""
    while True:
        chunk = os.read(key_fd, 64)
        if not chunk:
            break
        key += chunk
    os.close(key_fd)
    result_path = job["result"]
    extra = job.get("extra") or {}
    payload: dict = {"ok": False, "stage": "setup", "violations": [], "losses": [], "error": None}

    def finish(code: int = 0):
        # The only write the harness makes outside the workdir: opened through the trusted flag.
        state["trusted_io"] += 1
        try:
            data = json.dumps(_sign(key, payload), ensure_ascii=False)
            fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, data.encode())
            os.close(fd)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    state = {"learner": False, "trusted_io": 0, "armed": False, "forward_calls": 0, "in_guard": 0}
    violations: list[tuple[str, str]] = []

    def violate(category: str, detail: str):
        if len(violations) < 50:
            violations.append((category, detail))

    import threading
    import torch
    import torch.nn.functional  # noqa: F401
    import torch.utils.checkpoint  # noqa: F401  (learners use it; import it before arming)
    import torch.utils._python_dispatch as pyd
    import torch.overrides as tov
    import torch.optim.optimizer as optim_hooks
    import torch.nn.modules.module as nn_hooks
    import transformers  # noqa: F401
    if extra.get("bitsandbytes"):             # learners may use its 8-bit optimizers (ch30); it loads native code
        import bitsandbytes  # noqa: F401

    from vramlab.models import get_preset, make_config

    torch.set_num_threads(int(job.get("threads", 1)))
    torch.manual_seed(0)
    backend = job["backend"]
    sim = backend == "sim"
    _getframe = sys._getframe
    _len_dispatch = torch._C._len_torch_dispatch_stack
    _dispatch_at = torch._C._get_dispatch_stack_at
    _len_function = torch._C._len_torch_function_stack
    _function_at = torch._C._get_function_stack_at

    # ---- 2. the meter, captured before anything else can touch it ------------------------------
    protected: list[tuple[object, str]] = []
    if sim:
        from vramlab.sim import allocator as sim_allocator, device as sim_device, emulation as sim_emu
        from vramlab.sim import kernels as sim_kernels, tracker as sim_tracker
        SimDevice, StorageTracker = sim_device.SimDevice, sim_tracker.StorageTracker
        for cls in (SimDevice, StorageTracker, sim_allocator.CachingAllocatorModel, sim_emu.CudaEmulation):
            for name, value in list(vars(cls).items()):
                if callable(value) or isinstance(value, (property, staticmethod, classmethod)):
                    protected.append((cls, name))
        for mod, names in ((sim_kernels, ("emulated_sdpa",)), (sim_device, ("current_sim_device",))):
            for name in names:
                protected.append((mod, name))
    import torch.cuda
    import torch.cuda.memory as cuda_memory
    cuda_names = ("max_memory_allocated", "memory_allocated", "memory_reserved", "max_memory_reserved",
                  "memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
                  "reset_accumulated_memory_stats", "empty_cache", "synchronize")
    for mod in (torch.cuda, cuda_memory):
        for name in cuda_names:
            if hasattr(mod, name):
                protected.append((mod, name))
    if not sim:
        from vramlab import cuda as vcuda
        for name, value in list(vars(vcuda.CudaDevice).items()):
            if callable(value):
                protected.append((vcuda.CudaDevice, name))

    # ---- 3. device and the exercise's scenario, set up by trusted code before any guard ---------
    world, rank = int(job.get("world_size", 1)), int(job.get("rank", 0))
    if world > 1:        # the ranks meet before any learner code: gloo's sockets live in C++, unaudited
        import datetime
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=job["init_method"], rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(job.get("dist_timeout", 300))))
    if sim:
        from vramlab.sim.device import SimDevice as _Sim
        dev = _Sim(timeline=False, cublas_workspace=bool(extra.get("cublas_workspace", True)))
    else:
        from vramlab.cuda import CudaDevice as _Cuda
        dev = _Cuda()
    dev.__enter__()
    h = types.SimpleNamespace(job=job, extra=extra, torch=torch, dev=dev, sim=sim, payload=payload, model=None,
                              violate=violate, seconds=0.0, rank=rank, world=world,
                              rank_rows=lambda n: slice(rank * n // world, (rank + 1) * n // world))
    _PRESET_CLASSES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
                       "mixtral": "MixtralForCausalLM"}

    def build_model(config: dict, seed: int):
        """A seeded model of the job's preset with `config` overrides, on the device, in train mode."""
        cfg = make_config(job["model"], attention="sdpa", dropout=0.0)
        for k, v in config.items():
            setattr(cfg, k, v)
        torch.manual_seed(seed)
        with torch.device(dev.torch_device):
            model = getattr(transformers, _PRESET_CLASSES[get_preset(job["model"]).family])(cfg)
        return model.train()

    def training_setup():
        """The job's model (seeded) and AdamW, on the device; remembered for the guards."""
        model = build_model(job.get("config") or {}, int(job["seed"]))
        params = list(model.parameters())
        h.model = model
        payload["param_count"] = sum(p.numel() for p in params)
        # p, grad, 2 AdamW states on the device; 2 where the states may live in host memory (offload)
        # (extra["floor_copies"]: 3 where each gradient is freed as soon as its parameter is updated,
        # 2.5 for ZeRO-2 over 2 ranks)
        copies = float(extra.get("floor_copies") or (2 if extra.get("allow_host") else 4))
        payload["static_bytes"] = int(sum(p.numel() * p.element_size() for p in params) * copies)
        return model, torch.optim.AdamW(params, lr=float(job["lr"]), foreach=True)

    def tokens(shape, on_host: bool = False):
        """Seeded token ids: on the device, or in host memory (not device memory)."""
        gen = torch.Generator().manual_seed(int(job["seed"]) + 1)
        vocab = int((job.get("config") or {}).get("vocab_size") or get_preset(job["model"]).vocab)
        with (dev.host() if on_host else contextlib.nullcontext()):
            t = torch.randint(0, vocab, tuple(shape), generator=gen)
        return t if on_host else t.to(dev.torch_device)

    @contextlib.contextmanager
    def quiet():
        """The harness's own bookkeeping (fingerprints, digests): off the meter, outside the audit hook."""
        armed, state["armed"] = state["armed"], False
        if sim:
            tracker.paused += 1
        try:
            yield
        finally:
            if sim:
                tracker.paused -= 1
            state["armed"] = armed

    def fingerprint(params) -> list[float]:
        """Fixed random projections of every parameter (float64, on the host)."""
        out = []
        g = torch.Generator().manual_seed(int(job.get("probe_seed", 1234)))
        with quiet(), torch.no_grad():
            for p in params:
                flat = p.detach().reshape(-1).double().cpu()
                for _ in range(int(job.get("features_k", 2))):
                    out.append(float(flat @ torch.randn(flat.numel(), generator=g, dtype=torch.float64)))
        return out

    def reset_peak():
        if sim:
            orig_reset(dev)
        else:
            torch.cuda.synchronize()
            torch._C._cuda_resetPeakMemoryStats(dev.index)

    def peak() -> int:
        if sim:
            return int(orig_max_allocated(dev))
        torch.cuda.synchronize()
        return int(torch._C._cuda_memoryStats(dev.index)["allocated_bytes.all.peak"])

    def reserved_peak() -> int:
        if sim:
            return int(orig_max_reserved(dev))
        torch.cuda.synchronize()
        return int(torch._C._cuda_memoryStats(dev.index)["reserved_bytes.all.peak"])

    tracker = dev.tracker if sim else None
    orig_reset = SimDevice.reset_peak if sim else None
    orig_max_allocated = SimDevice.max_allocated if sim else None
    orig_max_reserved = SimDevice.max_reserved if sim else None
    h.build_model = build_model
    h.training_setup, h.tokens, h.quiet, h.fingerprint, h.reset_peak, h.peak, h.reserved_peak = (
        training_setup, tokens, quiet, fingerprint, reset_peak, peak, reserved_peak)
    h.gen = torch.Generator().manual_seed(int(job["seed"]) + 2)     # the scenarios' own data
    h.tracked = (lambda t: t.untyped_storage()._cdata in tracker.live) if sim else (lambda t: t.is_cuda)
    run_scenario = SCENARIOS[job.get("kind", "train_step")](h)
    model = h.model

    # ---- 4. guards ---------------------------------------------------------------------------------
    def caller_module(depth: int = 2) -> str:
        state["in_guard"] += 1
        try:
            return _getframe(depth).f_globals.get("__name__", "")
        finally:
            state["in_guard"] -= 1

    def caller_code(depth: int = 2):
        state["in_guard"] += 1
        try:
            return _getframe(depth).f_code
        finally:
            state["in_guard"] -= 1

    def counting(orig, category: str, detail: str, allowed_codes: frozenset = frozenset()):
        # who may call: code objects of trusted modules, captured now (a module name can be faked
        # with exec(src, {"__name__": ...}); a code object cannot)
        def guard(*args, **kwargs):
            if state["learner"] and category not in permitted and caller_code(2) not in allowed_codes:
                violate(category, detail)
            return orig(*args, **kwargs)
        guard.__name__ = getattr(orig, "__name__", "guard")
        guard.__doc__ = getattr(orig, "__doc__", None)
        return guard

    permitted = {"reset_peak"} if job.get("kind") == "monitor" else set()   # measure_peak resets the peak
    if extra.get("allow_host"):              # offload exercises: host memory is the point, not an escape
        permitted.add("host")
    originals: dict[tuple[int, str], object] = {}
    for owner, name in protected:
        originals[(id(owner), name)] = vars(owner).get(name, getattr(owner, name, None))

    def put(owner, name, value):
        setattr(owner, name, value)
        originals[(id(owner), name)] = value

    from . import scenarios as trusted_scenarios
    trusted_codes = frozenset(_code_objects([m for n, m in list(sys.modules.items()) if n.startswith("vramlab.sim.")]
                                            + [trusted_scenarios]))
    # bitsandbytes reaches its native kernels through ctypes: allowed from its own code objects only
    native_codes = frozenset(_code_objects([m for n, m in list(sys.modules.items())
                                            if n == "bitsandbytes" or n.startswith("bitsandbytes.")]))
    ctypes_codes = frozenset(_code_objects([sys.modules["ctypes"]])) if native_codes else frozenset()

    def native_caller_trusted() -> bool:
        """Is the nearest frame outside ctypes (and this hook) bitsandbytes' own code? `_getframe`
        reads no frame attribute, so the walk raises no audit event of its own."""
        depth = 2
        while True:
            try:
                code = _getframe(depth).f_code
            except ValueError:
                return False
            if code not in ctypes_codes:
                return code in native_codes
            depth += 1
    counter_codes = set()
    if sim:
        emulation = dev.emulation
        # contextlib.contextmanager keeps the generator function as __wrapped__: its code is the
        # only code allowed to move the tracker's pause/host counters
        for name in ("untracked", "host"):
            counter_codes.add(getattr(SimDevice, name).__wrapped__.__code__)
        put(SimDevice, "reset_peak", counting(SimDevice.reset_peak, "reset_peak", "调用了 reset_peak()"))
        orig_tracker_reset_code = StorageTracker.reset_peak.__code__
        put(StorageTracker, "reset_peak", counting(StorageTracker.reset_peak, "reset_peak", "调用了 tracker.reset_peak()"))
        put(SimDevice, "empty_cache", counting(SimDevice.empty_cache, "empty_cache", "调用了 empty_cache()"))
        put(sim_allocator.CachingAllocatorModel, "empty_cache",
            counting(sim_allocator.CachingAllocatorModel.empty_cache, "empty_cache", "清空了分配器缓存",
                     allowed_codes=trusted_codes))
        for name in ("untracked", "host", "to_host", "save_on_cpu", "adopt", "set_budget"):
            category = "host" if name in ("host", "to_host", "save_on_cpu") else "untracked"
            put(SimDevice, name, counting(getattr(SimDevice, name), category,
                                          f"调用了不计显存的接口 device.{name}()", allowed_codes=trusted_codes))

        class GuardedTracker(StorageTracker):
            """The same tracker; its pause/host counters remember who moved them."""

            def _counter_set(self, attr, value):
                if value and state["learner"]:
                    state["in_guard"] += 1
                    try:
                        code = _getframe(2).f_code
                    finally:
                        state["in_guard"] -= 1
                    if code not in counter_codes:
                        violate("tracker_paused", f"直接修改了计量器的 {attr} 计数")
                object.__setattr__(self, "_" + attr + "_v", value)

            def _field_set(self, attr, value):
                if state["learner"]:
                    state["in_guard"] += 1
                    try:
                        code = _getframe(2).f_code
                    finally:
                        state["in_guard"] -= 1
                    if code not in field_codes:
                        violate("tamper", f"直接修改了计量器的 {attr} 字段")
                self.__dict__["_" + attr + "_v"] = value

            peak = property(lambda self: self.__dict__["_peak_v"], lambda self, v: self._field_set("peak", v))
            allocated = property(lambda self: self.__dict__["_allocated_v"],
                                 lambda self, v: self._field_set("allocated", v))
            paused = property(lambda self: self.__dict__.get("_paused_v", 0),
                              lambda self, v: self._counter_set("paused", v))
            host = property(lambda self: self.__dict__.get("_host_v", 0),
                            lambda self, v: self._counter_set("host", v))

        # the tracker's own methods (captured before any learner code runs) may move its fields
        field_codes = {f.__code__ for f in vars(StorageTracker).values() if isinstance(f, types.FunctionType)}
        field_codes.add(orig_tracker_reset_code)
        tracker.__dict__["_peak_v"] = tracker.__dict__.pop("peak")
        tracker.__dict__["_allocated_v"] = tracker.__dict__.pop("allocated")
        tracker.__class__ = GuardedTracker
        guarded_keys = set(vars(GuardedTracker))
        protected.append((GuardedTracker, "paused"))
        protected.append((GuardedTracker, "host"))
        originals[(id(GuardedTracker), "paused")] = vars(GuardedTracker)["paused"]
        originals[(id(GuardedTracker), "host")] = vars(GuardedTracker)["host"]

    for mod in (torch.cuda, cuda_memory):
        for name in ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats",
                     "empty_cache"):
            if hasattr(mod, name):
                put(mod, name, counting(getattr(mod, name), "reset_peak" if "reset" in name else "empty_cache",
                                        f"调用了 torch.cuda.{name}()"))

    def modes_ok(function_modes: bool = True) -> bool:
        if not sim:
            return True
        d = any(_dispatch_at(i) is tracker for i in range(_len_dispatch()))
        if not function_modes:
            return d
        f = any(_function_at(i) is emulation for i in range(_len_function()))
        return d and f

    def guard_pop(orig, label):
        def guard(*args, **kwargs):
            out = orig(*args, **kwargs)
            # a function mode is legitimately off its stack while its own handler runs, so only
            # the dispatch-level tracker is checked here
            if state["learner"] and not modes_ok(function_modes=False):
                violate("dispatch_escape", f"{label} 把显存计量器移出了模式栈")
            return out
        guard.__name__ = getattr(orig, "__name__", "guard")
        return guard

    def guard_ctx(orig, label):
        def guard(*args, **kwargs):
            if state["learner"]:
                who = caller_module(2)
                if not who.startswith(("torch", "transformers", "vramlab.sim", "contextlib", "functools")):
                    violate("dispatch_escape", f"调用了 {label}")
            return orig(*args, **kwargs)
        guard.__name__ = getattr(orig, "__name__", "guard")
        return guard

    escape_targets = {}
    for owner, name in ((torch._C, "_unset_dispatch_mode"), (pyd, "_unset_infra_mode"), (pyd, "_disable_infra_mode"), (torch._C, "_pop_torch_dispatch_stack"),
                        (torch._C, "_pop_torch_function_stack"), (pyd, "_pop_mode"),
                        (pyd, "_pop_mode_temporarily"), (pyd, "_disable_current_modes"),
                        (tov, "_pop_mode"), (tov, "_pop_mode_temporarily")):
        if hasattr(owner, name):
            escape_targets[id(getattr(owner, name))] = guard_pop(getattr(owner, name), name)
    for owner, name in ((torch._C, "DisableTorchFunction"), (torch._C, "DisableTorchFunctionSubclass"),
                        (torch._C, "_DisableTorchDispatch"), (torch._C, "_ExcludeDispatchKeyGuard"),
                        (torch._C, "_ForceDispatchKeyGuard"), (torch._C, "_set_dispatch_mode"),
                        (torch._C, "_push_on_torch_dispatch_stack")):
        if hasattr(owner, name):
            escape_targets[id(getattr(owner, name))] = guard_ctx(getattr(owner, name), name)
    import _thread

    def guard_thread(orig):
        def guard(*args, **kwargs):
            if state["learner"]:
                violate("thread", "启动了新线程")
                raise PermissionError("评分沙箱：不允许启动线程")
            return orig(*args, **kwargs)
        return guard
    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        if hasattr(_thread, name):
            escape_targets[id(getattr(_thread, name))] = guard_thread(getattr(_thread, name))
    # replace every module-level alias of those functions (e.g. `from torch._C import ...`)
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, value in list(d.items()):
            repl = escape_targets.get(id(value))
            if repl is not None and repl is not value:
                try:
                    d[name] = repl
                except Exception:
                    pass

    block_types = tuple({type(m) for m in (model.modules() if model is not None else ())
                         if type(m).__name__.endswith(("Block", "Layer", "DecoderLayer"))})
    counts = {"model": 0, "autocast": 0, "blocks": 0}

    def forward_hook(module, args, output):
        state["forward_calls"] += 1
        if module is model:
            counts["model"] += 1
            if torch.is_autocast_enabled(dev.type):
                counts["autocast"] += 1
        elif block_types and isinstance(module, block_types):
            counts["blocks"] += 1
        if state["learner"] and not modes_ok():
            violate("dispatch_escape", f"前向（{type(module).__name__}）运行时显存计量器不在模式栈里")
        if (state["learner"] and isinstance(module, torch.nn.Embedding) and args and isinstance(args[0], torch.Tensor)
                and args[0].numel() and not h.tracked(args[0])):
            violate("untracked", "模型的输入不在显存里：先用 device.to_device() 把这个 batch 搬到设备上")

    fwd_handle = nn_hooks.register_module_forward_hook(forward_hook, always_call=True)

    def opt_pre_hook(opt, args, kwargs):
        state["opt_steps"] = state.get("opt_steps", 0) + 1
        if not sim:
            return
        if not modes_ok():
            violate("dispatch_escape", "optimizer.step() 运行时显存计量器不在模式栈里")
        for p in (q for group in opt.param_groups for q in group["params"]):
            if model_params is not None and id(p) not in model_params:
                continue            # e.g. host copies of the parameters (optimizer offload, allow_host only)
            g = p.grad
            if g is not None and g.untyped_storage()._cdata not in tracker.live:
                violate("untracked_grad", "有梯度张量没有被显存计量器记录（在计量之外创建）")
                break
    model_params = {id(p) for p in model.parameters()} if model is not None and extra.get("allow_host") else None
    opt_handle = optim_hooks.register_optimizer_step_pre_hook(opt_pre_hook)

    # snapshot identities (after our own wrappers are in place)
    snapshot = {}
    for owner, name in protected:
        obj = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        snapshot[(id(owner), name)] = (owner, name, obj, getattr(obj, "__code__", None))

    def integrity() -> list[str]:
        bad = []
        for (owner, name, obj, code) in snapshot.values():
            now = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
            if now is not obj or getattr(now, "__code__", None) is not code:
                bad.append(f"{getattr(owner, '__name__', owner)}.{name}")
        for obj in ((dev, tracker, emulation, getattr(dev, "allocator", None)) if sim else (dev,)):
            if obj is None:
                continue
            for name, value in vars(obj).items():
                if callable(value) and hasattr(type(obj), name) and not isinstance(value, type):
                    bad.append(f"{type(obj).__name__}.{name}（实例属性覆盖了方法）")
        if sim:
            if set(vars(GuardedTracker)) != guarded_keys:
                bad.append("GuardedTracker")
            if dev.tracker is not tracker or type(tracker) is not GuardedTracker:
                bad.append("device.tracker")
            if dev.emulation is not emulation:
                bad.append("device.emulation")
            if tracker.paused or tracker.host:
                bad.append("tracker.paused/host")
        return bad

    # ---- audit hook: the part learner code cannot uninstall --------------------------------------
    workdir = os.path.realpath(job["workdir"])
    protected_dirs = [os.path.realpath(p) for p in job.get("protected_read", [])]
    allowed_dirs = [os.path.realpath(p) for p in job.get("allowed_read", [])]
    forbidden_dirs = [os.path.realpath(p) for p in job.get("forbidden_read", [])]

    def readable(rp) -> bool:
        return not (under(rp, forbidden_dirs) or (under(rp, protected_dirs) and not under(rp, allowed_dirs)))
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def under(path, roots) -> bool:
        return any(path == r or path.startswith(r + os.sep) for r in roots)

    def real(p):
        if isinstance(p, int):
            return None
        if isinstance(p, bytes):
            p = os.fsdecode(p)
        try:
            return os.path.realpath(os.path.join(workdir, os.fspath(p)))
        except Exception:
            return None

    deny_events = {
        "subprocess.Popen": "fork", "os.system": "fork", "os.exec": "fork", "os.posix_spawn": "fork",
        "os.spawn": "fork", "os.fork": "fork", "os.forkpty": "fork", "pty.spawn": "fork",
        "_thread.start_new_thread": "thread", "socket.__new__": "network", "socket.connect": "network",
        "socket.bind": "network", "gc.get_objects": "introspection", "gc.get_referrers": "introspection",
        "gc.get_referents": "introspection", "sys._current_frames": "introspection",
        "sys.addaudithook": "introspection", "sys._getframe": "introspection",
        "os.putenv": "env", "os.unsetenv": "env", "os.chdir": "filesystem",
    }
    path_write_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                         "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile",
                         "shutil.move", "shutil.copytree", "os.chflags", "os.lchflags", "os.setxattr",
                         "os.removexattr"}

    def audit(event, args):
        if not state["armed"] or state["trusted_io"]:
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            rp = real(path)
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if rp is None:
                return
            if writing and not under(rp, [workdir]):
                violate("filesystem", f"试图写入评分目录之外的文件：{rp}")
                raise PermissionError(f"评分沙箱：不允许写入 {rp}")
            if not readable(rp):
                violate("forbidden_read", f"试图读取课程目录里的文件：{rp}")
                raise PermissionError(f"评分沙箱：不允许读取 {rp}")
            return
        if event in ("os.listdir", "os.scandir"):
            rp = real(args[0] if args else ".")
            if rp and not readable(rp):
                violate("forbidden_read", f"试图列出课程目录：{rp}")
                raise PermissionError("评分沙箱：不允许列出课程目录")
            return
        if event in path_write_events:
            for a in args:
                if isinstance(a, (str, bytes, os.PathLike)):
                    rp = real(a)
                    if rp and not under(rp, [workdir]):
                        violate("filesystem", f"试图修改评分目录之外的文件：{rp}")
                        raise PermissionError(f"评分沙箱：不允许修改 {rp}")
            return
        if event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            if not args or args[0] != os.getpid():
                violate("fork", "试图向其他进程发送信号")
                raise PermissionError("评分沙箱：不允许向其他进程发送信号")
            return
        if event == "object.__getattr__":
            if len(args) > 1 and args[1] in ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"):
                if not state["in_guard"]:
                    violate("introspection", f"读取了栈帧（{args[1]}）")
                    raise PermissionError("评分沙箱：不允许访问栈帧")
            return
        if event == "object.__setattr__":
            if len(args) > 1 and args[1] == "__code__":
                violate("tamper", "修改了函数的 __code__")
                raise PermissionError("评分沙箱：不允许修改函数代码")
            return
        if event.startswith("ctypes."):
            if native_codes and native_caller_trusted():
                return
            violate("native", f"使用了 ctypes（{event}）")
            raise PermissionError("评分沙箱：不允许使用 ctypes")
        if event == "import":
            name = args[0] if args else ""
            if isinstance(name, str) and name.startswith(("vramlab.exercises", "vramlab.grader", "vramlab.notebook_check")):
                violate("forbidden_import", f"导入了评分器内部模块 {name}")
                raise ImportError(f"评分沙箱：不允许导入 {name}")
            return
        cat = deny_events.get(event)
        if cat is not None:
            if event == "sys._getframe":
                if state["in_guard"] or not state["learner"]:
                    return
                # libraries (logging, typing, torch) look at their own callers; only code the
                # learner wrote, directly or through one helper (inspect.currentframe), is refused
                state["in_guard"] += 1
                try:
                    f = _getframe(1)
                    names = []
                    while f is not None and len(names) < 4:
                        names.append(f.f_code.co_filename)
                        f = f.f_back
                finally:
                    state["in_guard"] -= 1
                if "<submission>" not in names[:3]:
                    return
            violate(cat, f"调用了被禁止的操作 {event}")
            raise PermissionError(f"评分沙箱：不允许 {event}")

    sys.addaudithook(audit)

    # ---- 5. the learner's code ---------------------------------------------------------------------
    payload["stage"] = "load"
    with open(job["source_file"], encoding="utf-8") as f:
        source = f.read()
    for name in list(sys.modules):
        if name.startswith(("vramlab.exercises", "vramlab.notebook_check")):
            del sys.modules[name]
    namespace = {"__name__": "submission", "__builtins__": __builtins__}
    state["armed"] = True
    state["learner"] = True
    try:
        code = compile(source, "<submission>", "exec")
        exec(code, namespace)
        fn = namespace.get(job["function"])
        if not callable(fn):
            raise NameError(job["function"])
    except SystemExit as e:
        state["learner"] = False
        payload.update(error={"kind": "exit", "message": f"代码在导入时调用了 sys.exit({e.code!r})"})
        finish()
    except NameError as e:
        state["learner"] = False
        payload.update(error={"kind": "missing_function", "message": f"没有找到函数 {job['function']}：{e}"})
        finish()
    except BaseException as e:  # noqa: BLE001 - any failure is a graded failure
        state["learner"] = False
        payload.update(error={"kind": "exception", "message": f"导入代码时出错：{type(e).__name__}: {str(e)[:500]}"})
        finish()
    state["learner"] = False

    if "MODEL_NAME" in extra:                # ch03: the preset of this scale, whatever the code says
        namespace["MODEL_NAME"] = extra["MODEL_NAME"]

    def call(thunk):
        """Run learner code under the guards; afterwards the meter must still be intact."""
        state["learner"] = True
        t0 = time.perf_counter()
        try:
            return thunk()
        finally:
            state["learner"] = False
            if not sim and torch.cuda.is_available():
                torch.cuda.synchronize()
            h.seconds = time.perf_counter() - t0
            if not modes_ok():
                violate("dispatch_escape", "函数返回后显存计量器不在模式栈里")
            bad = integrity()
            if bad:
                violate("tamper", "计量器或 torch 显存函数被替换：" + "、".join(bad[:5]))

    def training_call(thunk, label: str, min_steps: int = 1):
        """`call` for code that trains: it must run the model and step the optimizer."""
        before, fwd, opt = dict(counts), state["forward_calls"], state.get("opt_steps", 0)
        value = call(thunk)
        h.calls.append({k: counts[k] - before[k] for k in counts})
        if state["forward_calls"] == fwd:
            violate("skipped_work", f"{label}没有调用模型的前向")
        if state.get("opt_steps", 0) - opt < min_steps:
            violate("skipped_work", f"{label}调用 optimizer.step() 的次数少于 {min_steps}")
        return value

    def training_result(before: list[float]) -> dict:
        breakdown = dict(tracker.breakdown(tracker.peak_records)) if sim else {}
        return {"breakdown": breakdown, "update": [a - b for a, b in zip(fingerprint(h.model.parameters()), before)],
                "calls": h.calls, "n_blocks": len([m for m in h.model.modules() if block_types and isinstance(m, block_types)])}

    h.call, h.training_call, h.training_result, h.calls = call, training_call, training_result, []
    payload["stage"] = "run"
    try:
        payload.update(run_scenario(fn))
    except SystemExit as e:
        state["learner"] = False
        payload.update(error={"kind": "exit", "message": f"函数里调用了 sys.exit({e.code!r})"}, violations=violations)
        finish()
    except BaseException as e:  # noqa: BLE001
        state["learner"] = False
        oom = isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "memory" in str(e).lower()
        wrong = isinstance(e, WrongAnswer)
        payload.update(error={"kind": "incorrect" if wrong else "oom" if oom else "exception",
                              "message": f"{type(e).__name__}: {str(e)[:800]}"}, violations=violations)
        finish()

    payload["stage"] = "check"
    bad = integrity()
    if bad:
        violate("tamper", "计量器或 torch 显存函数被替换：" + "、".join(bad[:5]))
    if fwd_handle.id not in nn_hooks._global_forward_hooks:
        violate("tamper", "评分器的前向钩子被移除")
    if opt_handle.id not in optim_hooks._global_optimizer_pre_hooks:
        violate("tamper", "评分器的优化器钩子被移除")
    payload.update(ok=True, stage="done", violations=violations, backend=backend, torch_version=torch.__version__)
    del threading
    finish()


if __name__ == "__main__":
    try:
        main(sys.argv)
    except SystemExit:
        raise
    except BaseException as exc:  # a harness failure: the parent sees no result file
        print(f"harness failure: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(70)
