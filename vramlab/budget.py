"""A virtual card: `with vramlab.device_budget("2 GiB") as dev:` makes the device that small.

On the simulated device, an allocation that would not fit raises `torch.OutOfMemoryError` with
the message CUDA prints (after the allocator model has tried releasing its cache, as the real
one does), so OOM-handling code written for GPUs runs unchanged and the process stays usable.
On CUDA it caps the caching allocator with `torch.cuda.set_per_process_memory_fraction`; the
CUDA context (hundreds of MiB) is outside that cap, as it is outside every allocator figure.
"""
from __future__ import annotations

import contextlib

import torch

from .units import parse_bytes


@contextlib.contextmanager
def device_budget(budget, backend: str = "auto", fake: bool = False):
    """Limit the current device to `budget` ("2 GiB", "512MiB" or bytes).

    If a simulated device is already active, its capacity is lowered for the block; otherwise a
    fresh device is opened (CUDA when available and backend allows, else the simulated one)."""
    from .meter import open_device
    from .sim.device import current_sim_device

    nbytes = parse_bytes(budget)
    sim = current_sim_device()
    if sim is not None and backend in ("auto", "sim"):
        previous = sim.budget
        if sim.allocated() > nbytes:
            raise ValueError(f"显存预算 {budget} 小于设备上已分配的显存，无法收紧")
        sim.set_budget(nbytes)
        try:
            yield sim
        finally:
            sim.set_budget(previous)
        return
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "sim"
    with open_device(backend, fake=fake, budget=nbytes) as dev:
        yield dev
