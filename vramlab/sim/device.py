"""The simulated device: a GPU's memory accounting for code that runs on the CPU.

    with SimDevice() as dev:                 # everything created inside lives "on the device"
        model = build_model("tiny")
        loss = model(ids, labels=ids).loss
        loss.backward()
        print(dev.max_allocated())            # what torch.cuda.max_memory_allocated() would say

Pass `fake=True` to run under FakeTensorMode: tensors have shapes and dtypes but no data, so
"what would GPT-2 small, batch 8, sequence 512 take on a GPU?" is answered in seconds on a laptop.

What the device models, and why:
* live storages, rounded and placed by a model of the CUDA caching allocator -> `allocated`,
  `reserved` and fragmentation (vramlab.sim.allocator, vramlab.sim.tracker);
* CUDA's attention kernels, dropout masks and autocast policy (vramlab.sim.emulation), because the
  CPU's own kernels keep different tensors;
* the cuBLAS workspaces PyTorch allocates through the caching allocator: one per thread that runs
  a matmul, i.e. one for the forward (the Python thread) and one for the backward (the autograd
  engine's device thread), 32 MiB each on Hopper GPUs (`4096 * 8 * 1024` bytes for sm90 in
  aten/src/ATen/cuda/CublasHandlePool.cpp; set by `CUBLAS_WORKSPACE_CONFIG`). The H200 reference
  shows it: the first step's peak, reached before any backward matmul, is 32 MiB lower in a fresh
  process than in one whose backward thread already holds its workspace;
* host memory: tensors created under `dev.host()` or saved by `dev.save_on_cpu()` are not device
  memory, although on the simulated device they, like everything, sit in CPU RAM;
* a card size (`budget`): an allocation that does not fit raises `torch.OutOfMemoryError`
  with the message CUDA would print, after the allocator has tried freeing its cache.
The CUDA context itself (hundreds of MiB outside PyTorch's allocator) is not modelled: no
allocator figure shows it either.
"""
from __future__ import annotations

import contextlib

import torch
import torch.optim.optimizer as optim_hooks
from torch._subclasses.fake_tensor import FakeTensorMode

from ..units import MiB, fmt_bytes
from .allocator import CachingAllocatorModel
from .emulation import CudaEmulation
from .tracker import CATEGORIES, StorageTracker

CUBLAS_WORKSPACE_BYTES = 32 * MiB
_MATMUL_OPS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm,
               torch.ops.aten.addbmm, torch.ops.aten.addmv, torch.ops.aten.mv}

_active: list["SimDevice"] = []


def current_sim_device() -> "SimDevice | None":
    return _active[-1] if _active else None


class SimDevice:
    backend = "sim"
    type = "cpu"                  # what torch.autocast(device.type) and .to(device) need here
    torch_device = torch.device("cpu")

    def __init__(self, fake: bool = False, budget: int | None = None, allocator: bool = True,
                 cublas_workspace: bool = True, timeline: bool = True):
        self.fake = fake
        self.budget = budget
        self.allocator = CachingAllocatorModel(budget) if allocator else None
        self.tracker = StorageTracker(self, self.allocator, budget, keep_timeline=timeline)
        self.emulation = CudaEmulation(self)
        self._cublas_workspace = cublas_workspace
        self.tracker.watch_ops = cublas_workspace        # before_op does nothing without it
        self._workspaces: dict[str, torch.Tensor] = {}     # thread ("forward"/"backward") -> workspace
        self._module_names: dict[int, str] = {}
        self._stack: list[str] = []
        self._in_optimizer = 0
        self._exit_stack: contextlib.ExitStack | None = None

    # -- context -------------------------------------------------------------------------------
    def __enter__(self) -> "SimDevice":
        es = contextlib.ExitStack()
        if self.fake:
            self.fake_mode = FakeTensorMode()
            es.enter_context(self.fake_mode)
            original_swap = torch.utils.swap_tensors

            def swap_tensors(t1, t2):
                # Module.to() always swaps fake parameters, and PyTorch refuses to swap a tensor
                # that fake-tensor bookkeeping holds a weakref to, even when nothing changes
                # (peft calls .to() with the adapter's own device and dtype). Skip such no-ops.
                if (t1.dtype == t2.dtype and t1.shape == t2.shape and t1.stride() == t2.stride()
                        and t1.untyped_storage()._cdata == t2.untyped_storage()._cdata):
                    return
                try:
                    original_swap(t1, t2)
                except RuntimeError:
                    t1.data = t2            # a real conversion (e.g. dtype): move the data instead
            torch.utils.swap_tensors = swap_tensors
            es.callback(setattr, torch.utils, "swap_tensors", original_swap)
            self._skip_packing_check(es)
        es.enter_context(self.tracker)
        es.enter_context(self.emulation)
        nn_hooks = torch.nn.modules.module
        es.callback(nn_hooks.register_module_forward_pre_hook(self._on_forward_pre).remove)
        es.callback(nn_hooks.register_module_forward_hook(self._on_forward_post, always_call=True).remove)
        es.callback(optim_hooks.register_optimizer_step_pre_hook(self._on_step_pre).remove)
        es.callback(optim_hooks.register_optimizer_step_post_hook(self._on_step_post).remove)
        original_resize = torch.UntypedStorage.resize_

        def resize_(storage, size):         # not an aten op: the dispatch mode never sees it
            out = original_resize(storage, size)
            self.tracker.resized(storage)
            return out
        torch.UntypedStorage.resize_ = resize_
        es.callback(setattr, torch.UntypedStorage, "resize_", original_resize)
        self._refuse_host_views(es)
        original_clear = torch.clear_autocast_cache

        def clear_autocast_cache():       # autocast's __exit__ calls this when the outermost exits
            self.emulation.clear_cast_cache()
            original_clear()
        torch.clear_autocast_cache = clear_autocast_cache
        es.callback(setattr, torch, "clear_autocast_cache", original_clear)
        _active.append(self)
        es.callback(_active.remove, self)
        self._exit_stack = es
        return self

    def __exit__(self, *exc):
        es, self._exit_stack = self._exit_stack, None
        return es.__exit__(*exc)

    @staticmethod
    def _refuse_host_views(es: contextlib.ExitStack):
        """numpy(), np.asarray() and DLPack exports of a device tensor raise, as on CUDA: patched on
        the class (and torch's to_dlpack), so saved-tensor hooks running inside an op refuse too."""
        import torch.utils.dlpack as dlpack
        from .emulation import HOST_VIEWS, refuse_host_view

        def guarded(original):
            def method(t, *args, **kwargs):
                refuse_host_view(_active, t)
                return original(t, *args, **kwargs)
            method.__name__, method.__doc__ = original.__name__, original.__doc__
            return method
        for name in HOST_VIEWS:
            own = name in torch.Tensor.__dict__          # numpy is TensorBase's: restore by deleting
            original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, guarded(original))
            es.callback(setattr, torch.Tensor, name, original) if own else es.callback(delattr, torch.Tensor, name)
        original_to_dlpack = dlpack.to_dlpack
        dlpack.to_dlpack = torch.to_dlpack = guarded(original_to_dlpack)
        es.callback(setattr, dlpack, "to_dlpack", original_to_dlpack)
        es.callback(setattr, torch, "to_dlpack", original_to_dlpack)

    @staticmethod
    def _skip_packing_check(es: contextlib.ExitStack):
        """transformers reads the position ids' values to decide whether a batch packs several
        sequences (masking_utils.find_packed_sequence_indices). Fake tensors have no values, so it
        assumes packing and builds a B x S x S mask: SDPA then loses its is_causal path and a
        grouped-query model repeats K and V for every query head. On a GPU the ids are read, nothing
        is packed and no mask is built; do the same here (vramlab's steps never pack sequences)."""
        try:
            import transformers.masking_utils as mu
        except ImportError:
            return
        from torch._subclasses.fake_tensor import FakeTensor

        original = mu.find_packed_sequence_indices

        def find_packed_sequence_indices(position_ids):
            return None if isinstance(position_ids, FakeTensor) else original(position_ids)
        mu.find_packed_sequence_indices = find_packed_sequence_indices
        es.callback(setattr, mu, "find_packed_sequence_indices", original)

    # -- context for the tracker ------------------------------------------------------------------
    def phase(self) -> str:
        if torch._C._current_autograd_node() is not None:
            return "backward"
        if self._in_optimizer:
            return "optimizer"
        return "forward" if self._stack else "idle"

    def current_location(self) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            return f"backward:{node.name()}"
        if self._in_optimizer:
            return "optimizer.step"
        return self._stack[-1] if self._stack else "-"

    def before_op(self, func):
        if not self._cublas_workspace or func.overloadpacket not in _MATMUL_OPS:
            return
        thread = "backward" if torch._C._current_autograd_node() is not None else "forward"
        if thread not in self._workspaces:
            ws = torch.empty(CUBLAS_WORKSPACE_BYTES, dtype=torch.uint8)
            self.tracker.track(ws, None, label="cuda_overhead")
            self._workspaces[thread] = ws

    def _on_forward_pre(self, module, args):
        mid = id(module)
        # a root module names its tree, except a block a checkpoint recomputes during backward:
        # it keeps the names the whole model's forward gave it
        if not self._stack and (mid not in self._module_names or torch._C._current_autograd_node() is None):
            for name, sub in module.named_modules():
                self._module_names[id(sub)] = name or type(sub).__name__
        self._stack.append(self._module_names.get(mid, type(module).__name__))
        for t in module.parameters(recurse=False):
            self.tracker.label_tensor(t, "parameters")
        for t in module.buffers(recurse=False):
            self.tracker.label_tensor(t, "parameters")

    def _on_forward_post(self, module, args, output):
        if self._stack:
            self._stack.pop()

    def _on_step_pre(self, optimizer, args, kwargs):
        self._stack.clear()
        self._in_optimizer += 1
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.tracker.label_tensor(p, "parameters")
                if p.grad is not None:
                    self.tracker.label_tensor(p.grad, "gradients")

    def _on_step_post(self, optimizer, args, kwargs):
        self._in_optimizer -= 1
        self.label_optimizer_state(optimizer)

    def label_optimizer_state(self, optimizer):
        for state in optimizer.state.values():
            for v in state.values():
                self.tracker.label_tensor(v, "optimizer_state")

    # -- host memory and offload ----------------------------------------------------------------
    @contextlib.contextmanager
    def untracked(self):
        """Allocations inside are not charged (used to emulate a kernel's internals)."""
        self.tracker.paused += 1
        try:
            yield
        finally:
            self.tracker.paused -= 1

    @contextlib.contextmanager
    def host(self):
        """Tensors created inside live in host (CPU) memory, not on the device."""
        self.tracker.host += 1
        try:
            yield
        finally:
            self.tracker.host -= 1

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """The simulated `t.to("cpu")`: a copy that does not count as device memory."""
        with self.host():
            return t.detach().clone()

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """The simulated `t.to("cuda")`: a device copy of a host tensor."""
        return t.clone()

    def save_on_cpu(self, pin_memory: bool = True):
        """Like torch.autograd.graph.save_on_cpu: tensors saved for backward move to host memory
        in the forward pass and come back (a fresh device copy) when backward needs them."""
        def pack(t):
            return self.to_host(t)

        def unpack(packed):
            return self.to_device(packed)
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def adopt(self, *objs):
        """Count tensors (or a module's parameters and buffers) created outside the device as
        if they had been moved onto it."""
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                for t in obj.parameters():
                    self.tracker.track(t, None, label="parameters")
                for t in obj.buffers():
                    self.tracker.track(t, None, label="parameters")
            elif isinstance(obj, torch.Tensor):
                self.tracker.track(obj, None)

    # -- statistics, named like torch.cuda's -----------------------------------------------------
    def allocated(self) -> int:
        return self.tracker.allocated

    def max_allocated(self) -> int:
        return self.tracker.peak

    def reserved(self) -> int:
        return self.tracker.reserved()

    def max_reserved(self) -> int:
        return max(self.tracker.peak_reserved, self.reserved())

    def reset_peak(self):
        self.tracker.reset_peak()

    def empty_cache(self) -> int:
        return self.allocator.empty_cache() if self.allocator else 0

    def synchronize(self):
        pass

    # torch.cuda's own names, for code written against it: the same figures as above
    def memory_allocated(self) -> int:
        return self.allocated()

    def max_memory_allocated(self) -> int:
        return self.max_allocated()

    def memory_reserved(self) -> int:
        return self.reserved()

    def max_memory_reserved(self) -> int:
        return self.max_reserved()

    def reset_peak_memory_stats(self):
        self.reset_peak()

    def memory_stats(self) -> dict:
        """A subset of torch.cuda.memory_stats() with the same keys."""
        inactive = self.allocator.inactive_split_bytes() if self.allocator else 0
        return {
            "allocated_bytes.all.current": self.allocated(),
            "allocated_bytes.all.peak": self.max_allocated(),
            "reserved_bytes.all.current": self.reserved(),
            "reserved_bytes.all.peak": self.max_reserved(),
            "inactive_split_bytes.all.current": inactive,
            "num_alloc_retries": self.allocator.num_alloc_retries if self.allocator else 0,
        }

    def breakdown(self, at_peak: bool = True) -> dict[str, int]:
        recs = self.tracker.peak_records if at_peak else list(self.tracker.live.values())
        return self.tracker.breakdown(recs)

    def snapshot(self) -> dict:
        """Peak, breakdown at the peak, where the peak happened, and the timeline."""
        return {
            "peak_bytes": self.max_allocated(),
            "reserved_peak_bytes": self.max_reserved(),
            "breakdown": self.breakdown(),
            "peak_where": self.tracker.peak_where,
            "timeline": [{"allocated": a, "reserved": r, "label": lab} for a, r, lab in self.tracker.timeline],
        }

    def top_allocations(self, n: int = 10, at_peak: bool = True) -> list[dict]:
        recs = self.tracker.peak_records if at_peak else list(self.tracker.live.values())
        recs = sorted(recs, key=lambda r: -r.charged)[:n]
        return [{"bytes": r.charged, "op": r.op, "where": r.where, "category": r.category} for r in recs]

    # -- out of memory --------------------------------------------------------------------------
    def out_of_memory(self, request: int) -> torch.OutOfMemoryError:
        cap = self.budget or 0
        free = max(cap - self.reserved(), 0)
        allocated, reserved = self.allocated(), self.reserved()
        msg = (f"CUDA out of memory. Tried to allocate {fmt_bytes(request)}. GPU 0 has a total capacity "
               f"of {fmt_bytes(cap)} of which {fmt_bytes(free)} is free. Of the allocated memory "
               f"{fmt_bytes(allocated)} is allocated by PyTorch, and {fmt_bytes(reserved - allocated)} "
               f"is reserved by PyTorch but unallocated. "
               f"[vramlab 模拟显卡] 显存预算 {fmt_bytes(cap)} 不够：当前已分配 {fmt_bytes(allocated)}，"
               f"这次还要申请 {fmt_bytes(request)}（发生在 {self.current_location()}）。")
        return torch.OutOfMemoryError(msg)

    def set_budget(self, budget: int | None):
        self.budget = budget
        self.tracker.capacity = budget
        if self.allocator is not None:
            self.allocator.capacity = budget


__all__ = ["SimDevice", "current_sim_device", "CATEGORIES", "CUBLAS_WORKSPACE_BYTES"]
