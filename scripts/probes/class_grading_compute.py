"""Probe behind README's note on why a class is not graded in 15 minutes (issue 14): where one
grading's time goes, on one thread.

    .venv/bin/python scripts/probes/class_grading_compute.py

1. ch07's reference train_step (its CI model: tiny GPT-2 with 6 layers, batch 8, sequence 256):
   seconds per step in plain PyTorch and on the simulated device;
2. torch.profiler's top operators of the plain step, as shares of its CPU time;
3. a 1024x1024 matmul loop alone, then in two processes at once (do two gradings slow each other?).
"""
import multiprocessing as mp
import time

import torch
import transformers

from vramlab.exercises import get_exercise
from vramlab.models import make_config
from vramlab.sim.device import SimDevice


def ch07_setup():
    cfg = make_config("tiny", attention="sdpa", dropout=0.0)
    cfg.n_layer = 6
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    batch = torch.randint(0, cfg.vocab_size, (8, 256))
    spec = get_exercise("ch07-checkpoint")
    namespace = {}
    exec(spec.solution, namespace)
    return model, optimizer, batch, namespace[spec.function]


def seconds_per_step(sim: bool, steps: int = 3) -> float:
    device = SimDevice(timeline=False)
    if sim:
        device.__enter__()
    try:
        model, optimizer, batch, step = ch07_setup()
        step(model, optimizer, batch, device)               # warm-up
        t = time.perf_counter()
        for _ in range(steps):
            step(model, optimizer, batch, device)
        return (time.perf_counter() - t) / steps
    finally:
        if sim:
            device.__exit__(None, None, None)


def top_operators(n: int = 8):
    from torch.profiler import ProfilerActivity, profile

    model, optimizer, batch, step = ch07_setup()
    device = SimDevice(timeline=False)                      # not entered: only .type is read
    step(model, optimizer, batch, device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, optimizer, batch, device)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return [(e.key, e.self_cpu_time_total / total) for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:n]]


def matmul_seconds(_=None) -> float:
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t = time.perf_counter()
    for _ in range(60):
        a @ b
    return time.perf_counter() - t


if __name__ == "__main__":
    torch.set_num_threads(1)
    plain, sim = seconds_per_step(False), seconds_per_step(True)
    print(f"ch07 step, 1 thread: plain {plain:.3f} s, simulated device {sim:.3f} s ({sim / plain - 1:+.0%})")
    for name, share in top_operators():
        print(f"  {share:6.1%}  {name}")
    alone = matmul_seconds()
    with mp.get_context("spawn").Pool(2) as pool:
        together = pool.map(matmul_seconds, range(2))
    print(f"matmul loop: alone {alone:.2f} s, two at once {together[0]:.2f} s and {together[1]:.2f} s "
          f"({max(together) / alone - 1:+.0%})")
