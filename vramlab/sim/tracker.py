"""Count device memory the way the CUDA caching allocator does, by watching tensor storages.

Every aten op passes through `StorageTracker.__torch_dispatch__`. Each storage an op creates is
charged once (views and in-place results share it), rounded up like the allocator rounds, and
released when the storage itself dies (a weakref callback on the storage object). That is the
number `torch.cuda.memory_allocated()` reports on a GPU: live storages, not tensors.

Each storage is remembered as a `Record` with the op and module that created it and the phase
it was born in (forward, backward, optimizer step). What a checkpoint recomputes during
backward (a module's forward running inside a backward node) counts as activations. Records
are re-labelled as parameters, gradients or optimizer state when that becomes known, so the
breakdown at the peak is read from the records alive at the peak with their final labels.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..units import round_block
from .allocator import CachingAllocatorModel, SegmentOverflow

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries",
              "cuda_overhead", "other")
_PHASE_CATEGORY = {"forward": "activations", "backward": "temporaries", "optimizer": "temporaries",
                   "idle": "other"}


_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction


def _fake_scalar(t):
    """Under FakeTensorMode values are unknown; `.item()` reads 1 (False for bools) so code that
    needs a scalar (Adam's step count, Adafactor's norms) keeps going."""
    return False if t.dtype == torch.bool else (1.0 if t.dtype.is_floating_point else 1)


def _leaves(x):
    """The tensors in an op's output or arguments: tensors, and lists, tuples and dicts of them
    (what `tree_leaves` finds in aten's signatures, several times faster)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _leaves(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _leaves(y)


class Record:
    __slots__ = ("nbytes", "charged", "op", "where", "phase", "label", "block", "ref", "__weakref__")

    def __init__(self, nbytes, charged, op, where, phase, block):
        self.nbytes, self.charged, self.op, self.where, self.phase = nbytes, charged, op, where, phase
        self.block, self.label, self.ref = block, None, None

    @property
    def category(self) -> str:
        return self.label or _PHASE_CATEGORY[self.phase]


class StorageTracker(TorchDispatchMode):
    """The dispatch-level half of the simulated device (see vramlab.sim.device.SimDevice)."""

    def __init__(self, owner, allocator: CachingAllocatorModel | None, capacity: int | None,
                 keep_timeline: bool = True):
        super().__init__()
        self.owner = owner                      # SimDevice: supplies phase/module context and OOM text
        self.allocator = allocator
        self.capacity = capacity
        self.live: dict[int, Record] = {}
        self.allocated = 0
        self.peak = 0
        self._peak_records: list[Record] = []
        self._at_peak = False                   # the live set is still the one at the peak
        self.peak_where = ""
        self.keep_timeline = keep_timeline
        self.timeline: list[tuple[int, int, str]] = []   # (allocated, reserved, label)
        self.peak_reserved = 0
        self.paused = 0
        self.host = 0                           # >0: allocations are host memory, not counted
        self.watch_ops = True                   # call owner.before_op (the cuBLAS workspace) per op

    # -- dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path of every simulated run, once per aten op. Function modes (the emulation's)
        # stay active in here: without DisableTorchFunction each Tensor method below would make a
        # round trip through their Python handler.
        with _NO_TORCH_FUNCTION():
            if self.paused or self.host:
                if func is _LOCAL_SCALAR and self.owner.fake:
                    return _fake_scalar(args[0])
                return func(*args, **(kwargs or {}))
            if self.watch_ops:
                self.owner.before_op(func)
            if func is _LOCAL_SCALAR and self.owner.fake:
                return _fake_scalar(args[0])
            out = func(*args, **(kwargs or {}))
            inputs = None
            for t in ((out,) if type(out) is torch.Tensor else _leaves(out)):
                if t.is_meta:                         # meta tensors hold no memory
                    continue
                key = t.untyped_storage()._cdata
                if key in self.live:
                    self.track(t, func)               # known storage (maybe resized)
                    continue
                if inputs is None:                    # a view or in-place result of an untracked
                    inputs = {a.untyped_storage()._cdata for a in _leaves((args, kwargs))}
                if key not in inputs:                 # tensor (host memory) stays untracked
                    self.track(t, func)
            return out

    # -- accounting ----------------------------------------------------------------------------
    def on_device(self, t: torch.Tensor) -> bool:
        """Does `t` live in the device's memory (its storage is charged)?"""
        return t.untyped_storage()._cdata in self.live

    def reserved(self) -> int:
        return self.allocator.reserved if self.allocator else self.allocated

    def track(self, t: torch.Tensor, func=None, label: str | None = None):
        st = t.untyped_storage()
        key = st._cdata
        nbytes = st.nbytes()
        rec = self.live.get(key)
        if rec is not None:
            if nbytes != rec.nbytes:            # resize_ / set_ grew or shrank the storage
                self._release(key)
            else:
                if label and not rec.label:
                    rec.label = label
                return rec
        if nbytes == 0:
            return None
        op = (getattr(func, "__name__", None) or str(func)) if func is not None else "register"
        phase = self.owner.phase()
        # a module's forward running inside backward is a checkpoint recomputing it: what it makes
        # are that module's activations again, not the backward's own temporaries
        recomputing = getattr(self.owner, "_stack", None) if phase == "backward" else None
        where = f"recompute:{recomputing[-1]}" if recomputing else self.owner.current_location()
        block, charged = self._charge(nbytes)
        rec = Record(nbytes, charged, op, where, phase, block)
        rec.label = label or ("activations" if recomputing else None)
        rec.ref = weakref.ref(st, lambda _r, key=key: self._release(key))
        self.live[key] = rec
        self.allocated += charged
        self._booked(f"{op} @ {where}")
        return rec

    def _charge(self, nbytes: int):
        """Place `nbytes` on the device: (allocator block or None, bytes charged). Raises the
        CUDA-like OutOfMemoryError when it does not fit the card."""
        if self.allocator is not None:
            try:
                block = self.allocator.malloc(nbytes)
            except SegmentOverflow as e:
                request = e.request
            else:
                return block, block.size
            # raised outside the except block: a chained __context__ would keep the failing frames
            # (and the learner's tensors in them) alive after the OOM is caught, which CUDA does not do
            raise self.owner.out_of_memory(request)
        charged = round_block(nbytes)
        if self.capacity is not None and self.allocated + charged > self.capacity:
            raise self.owner.out_of_memory(charged)
        return None, charged

    def _booked(self, label: str):
        """After `allocated` changed: reserved peak, timeline point, peak snapshot."""
        if self.allocator is not None and self.allocator.reserved > self.peak_reserved:
            self.peak_reserved = self.allocator.reserved
        if self.keep_timeline:
            self.timeline.append((self.allocated, self.reserved(), label))
        if self.allocated > self.peak:
            self.peak = self.allocated
            self._at_peak = True
            self.peak_where = label

    @property
    def peak_records(self) -> list[Record]:
        """The records alive at the peak (with their labels of now)."""
        self._keep_peak()
        return self._peak_records

    def _keep_peak(self):
        # Copied only when the live set is about to lose a record (or is read): copying it at
        # every new peak, i.e. at nearly every allocation of a forward pass, cost O(n^2). A record
        # added while at the peak always makes a new peak, so the set is the peak's until then.
        if self._at_peak:
            self._peak_records = list(self.live.values())
            self._at_peak = False

    def _release(self, key: int):
        if key not in self.live:
            return
        self._keep_peak()
        rec = self.live.pop(key)
        self.allocated -= rec.charged
        if rec.block is not None:
            self.allocator.free(rec.block)
        if self.keep_timeline:
            self.timeline.append((self.allocated, self.reserved(), f"free {rec.op}"))

    def resized(self, st):
        """A storage changed size in place (`untyped_storage().resize_(n)`, as FSDP2 does to free
        and refill gathered parameters): charge its new size, keeping its record and label."""
        rec = self.live.get(st._cdata)
        if rec is None or st.nbytes() == rec.nbytes:
            return
        self._keep_peak()
        self.allocated -= rec.charged
        if rec.block is not None:
            self.allocator.free(rec.block)
            rec.block = None
        rec.nbytes, rec.charged = st.nbytes(), 0
        if rec.nbytes:
            rec.block, rec.charged = self._charge(rec.nbytes)
        self.allocated += rec.charged
        self._booked(f"resize_ {rec.op}")

    def label_tensor(self, t, label: str):
        if isinstance(t, torch.Tensor):
            rec = self.live.get(t.untyped_storage()._cdata)
            if rec is not None:
                rec.label = label

    def reset_peak(self):
        self.peak = self.allocated
        self.peak_reserved = self.reserved()
        self._at_peak = True
        self.peak_where = "reset"

    def breakdown(self, records) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for rec in records:
            out[rec.category] += rec.charged
        return out
