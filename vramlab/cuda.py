"""The real device: PyTorch's CUDA caching allocator, plus NVML for what the driver sees.

It has the same methods as the simulated device (vramlab.sim.device.SimDevice), so a workload,
a grader or a tutorial runs unchanged on either.
"""
from __future__ import annotations

import contextlib
import os

import torch


class CudaDevice:
    backend = "cuda"
    type = "cuda"
    fake = False

    def __init__(self, index: int = 0, budget: int | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("这台机器没有可用的 NVIDIA GPU（torch.cuda.is_available() 为 False）："
                               "请改用 --backend sim")
        self.index = index
        self.torch_device = torch.device("cuda", index)
        self.budget = budget
        self._saved_fraction = None

    def __enter__(self):
        torch.cuda.set_device(self.index)
        if self.budget:
            self.set_budget(self.budget)
        return self

    def __exit__(self, *exc):
        if self._saved_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.index)
            self._saved_fraction = None
        return False

    # -- statistics ------------------------------------------------------------------------------
    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.index)

    def max_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.index)

    def reserved(self) -> int:
        return torch.cuda.memory_reserved(self.index)

    def max_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.index)

    def reset_peak(self):
        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)

    def empty_cache(self) -> int:
        before = self.reserved()
        torch.cuda.empty_cache()
        return before - self.reserved()

    def synchronize(self):
        torch.cuda.synchronize(self.index)

    def memory_stats(self) -> dict:
        s = torch.cuda.memory_stats(self.index)
        keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "inactive_split_bytes.all.current", "num_alloc_retries")
        return {k: s.get(k, 0) for k in keys}

    def nvml_process_bytes(self) -> int | None:
        """Device memory the driver charges to this process (includes the CUDA context)."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid():
                    return int(proc.usedGpuMemory or 0)
            return None
        except pynvml.NVMLError:
            return None

    def breakdown(self, at_peak: bool = True) -> dict[str, int]:
        return {}                       # the CUDA allocator does not know what a tensor is for

    def snapshot(self) -> dict:
        return {"peak_bytes": self.max_allocated(), "reserved_peak_bytes": self.max_reserved(),
                "breakdown": {}, "peak_where": "", "timeline": []}

    # -- host memory and offload --------------------------------------------------------------------
    def host(self):
        return contextlib.nullcontext()

    def untracked(self):
        return contextlib.nullcontext()

    def to_host(self, t):
        return t.detach().to("cpu", non_blocking=False).pin_memory()

    def to_device(self, t):
        return t.to(self.torch_device, non_blocking=True)

    def save_on_cpu(self, pin_memory: bool = True):
        return torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)

    def adopt(self, *objs):
        pass

    def set_budget(self, budget: int | None):
        """Cap the caching allocator. The CUDA context is outside the cap (it is not allocator memory)."""
        self.budget = budget
        total = torch.cuda.get_device_properties(self.index).total_memory
        fraction = 1.0 if budget is None else min(budget / total, 1.0)
        torch.cuda.set_per_process_memory_fraction(fraction, self.index)
        self._saved_fraction = fraction
