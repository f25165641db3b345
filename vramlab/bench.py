"""`vramlab bench`: the instrument's performance and fidelity, measured in one run.

1. Tracker overhead: the same CPU training step with and without the simulated device
   (ratio of the faster of N runs each; goal <= 1.5x).
2. Fidelity: the simulated device's steady peak over the H200's for every reference row.
3. FakeTensorMode: seconds to answer "GPT-2 small, batch 8, seq 512" without allocating it.
"""
from __future__ import annotations

import json
import time

import torch

from .calibrate import calibrate
from .meter import open_device
from .runner import build_training, measure_workload
from .workload import Workload

_OVERHEAD_WORKLOAD = Workload(model="gpt2-mini", batch=4, seq=256)


class _Plain:
    """No device: the step as it runs untracked on the CPU."""
    backend, type, fake, torch_device = "none", "cpu", False, torch.device("cpu")

    def save_on_cpu(self):
        return torch.autograd.graph.save_on_cpu()


def _best_step_seconds(dev, w: Workload, repeats: int) -> float:
    _, _, step = build_training(w, dev)
    step()                                   # warm-up: optimizer state, allocator caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


def tracker_overhead(w: Workload = _OVERHEAD_WORKLOAD, repeats: int = 3) -> dict:
    plain = _best_step_seconds(_Plain(), w, repeats)
    with open_device("sim", timeline=False) as dev:
        tracked = _best_step_seconds(dev, w, repeats)
    return {"workload": w.to_dict(), "untracked_s": round(plain, 3), "tracked_s": round(tracked, 3),
            "ratio": round(tracked / plain, 3)}


def fake_mode_seconds(w: Workload = Workload(model="gpt2-small", batch=8, seq=512)) -> dict:
    t0 = time.perf_counter()
    m = measure_workload(w, backend="sim", fake=True)
    return {"workload": w.to_dict(), "seconds": round(time.perf_counter() - t0, 2),
            "peak_mib": round(m.peak_bytes / 2**20, 1)}


def run_bench(as_json: bool = False) -> dict:
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(),
              "overhead": tracker_overhead(), "fake": fake_mode_seconds(), "fidelity": calibrate("sim")}
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
        return result
    o, f = result["overhead"], result["fake"]
    print(f"基准（torch {result['torch']}，{result['threads']} 个 CPU 线程）")
    print(f"1. 跟踪开销：{o['workload']['model']} batch {o['workload']['batch']} seq {o['workload']['seq']}，"
          f"不跟踪 {o['untracked_s']} s/步，模拟设备 {o['tracked_s']} s/步，比值 {o['ratio']}x（目标 ≤ 1.5x）")
    print(f"2. FakeTensorMode：GPT-2 small b8 s512 三步共 {f['seconds']} s，峰值 {f['peak_mib']} MiB")
    print("3. 模拟设备与 H200 参考表逐行对比：")
    from .calibrate import print_report
    print_report(result["fidelity"])
    return result
