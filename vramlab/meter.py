"""One way to measure peak device memory, on a GPU or on the simulated device.

    m = measure(train_step, backend="sim")            # a callable: run it, report the peak
    with measure(backend="sim") as m:                  # or a block
        ...
    print(m.peak_bytes, m.breakdown)

For a training step, the peak that matters is the steady one: AdamW creates its state lazily in
the first `step()` and cuBLAS its workspace on the first matmul, so step 1 reads low.
`measure_steps(step, device, warmup=1, steps=2)` runs warm-up steps, resets the peak, then
measures, as the H200 reference table does.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .units import fmt_bytes


@dataclass
class Measurement:
    backend: str
    peak_bytes: int                       # max allocated: the graded figure
    reserved_peak_bytes: int = 0
    first_step_peak_bytes: int | None = None
    step_ms: float | None = None
    breakdown: dict = field(default_factory=dict)   # category -> bytes, at the peak (sim only)
    peak_where: str = ""
    fragmentation_bytes: int = 0          # reserved - allocated at the end
    inactive_split_bytes: int = 0
    nvml_process_bytes: int | None = None  # cuda only: what the driver charges this process
    fake: bool = False
    timeline: list = field(default_factory=list)
    workload: dict | None = None
    trainable_params: int | None = None
    torch_version: str = torch.__version__

    def to_dict(self, timeline: bool = False) -> dict:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d

    def __str__(self):
        return f"峰值显存 {fmt_bytes(self.peak_bytes)}（{self.backend}）"


def open_device(backend: str = "sim", fake: bool = False, budget: int | None = None, timeline: bool = True):
    """A device context: "sim" (simulated, optionally under FakeTensorMode), "cuda", or "auto"."""
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "sim"
    if backend == "sim":
        from .sim.device import SimDevice
        return SimDevice(fake=fake, budget=budget, timeline=timeline)
    if backend == "cuda":
        if fake:
            raise ValueError("--fake 只能用于模拟设备（--backend sim）")
        from .cuda import CudaDevice
        return CudaDevice(budget=budget)
    raise ValueError(f"未知后端 {backend!r}：可选 sim、cuda、auto")


def _result(dev, **extra) -> Measurement:
    snap = dev.snapshot()
    stats = dev.memory_stats()
    return Measurement(
        backend=dev.backend, peak_bytes=dev.max_allocated(), reserved_peak_bytes=dev.max_reserved(),
        breakdown=snap["breakdown"], peak_where=snap["peak_where"],
        fragmentation_bytes=dev.reserved() - dev.allocated(),
        inactive_split_bytes=stats.get("inactive_split_bytes.all.current", 0),
        nvml_process_bytes=dev.nvml_process_bytes() if hasattr(dev, "nvml_process_bytes") else None,
        fake=getattr(dev, "fake", False), timeline=snap["timeline"], **extra)


def measure_steps(step, dev, warmup: int = 1, steps: int = 2) -> Measurement:
    """Run `step()` `warmup` times, then `steps` times; the peak is over the last `steps` only.
    `first_step_peak_bytes` is the peak of the very first call."""
    first = None
    dev.reset_peak()
    for i in range(warmup):
        step()
        if i == 0:
            dev.synchronize()
            first = dev.max_allocated()
    dev.reset_peak()
    timings = []
    for _ in range(steps):
        dev.synchronize()
        t0 = time.perf_counter()
        step()
        dev.synchronize()
        timings.append((time.perf_counter() - t0) * 1000)
    if first is None:
        first = dev.max_allocated()
    return _result(dev, first_step_peak_bytes=first, step_ms=min(timings) if timings else None)


class measure:
    """Measure the peak of a callable or of a `with` block on a fresh device.

    measure(fn, backend="sim") runs fn() once inside the device and returns a Measurement;
    `with measure(backend="sim") as m:` fills `m.result` (a Measurement) when the block ends.
    Tensors must be created inside, since a fresh device starts empty."""

    def __new__(cls, fn=None, backend: str = "sim", fake: bool = False, budget: int | None = None):
        self = super().__new__(cls)
        self.backend, self.fake, self.budget = backend, fake, budget
        self.result = None
        if fn is None:
            return self
        with open_device(backend, fake=fake, budget=budget) as dev:
            dev.reset_peak()
            t0 = time.perf_counter()
            fn()
            dev.synchronize()
            return _result(dev, step_ms=(time.perf_counter() - t0) * 1000)

    def __enter__(self):
        self._dev = open_device(self.backend, fake=self.fake, budget=self.budget)
        self.device = self._dev.__enter__()
        self.device.reset_peak()
        return self

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                self.result = _result(self.device)
        finally:
            self._dev.__exit__(*exc)
        return False

    def __getattr__(self, name):          # m.peak_bytes etc. after the block
        if name != "result" and self.__dict__.get("result") is not None:
            return getattr(self.result, name)
        raise AttributeError(name)
