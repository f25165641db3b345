"""Probe behind chapter 8's note on `ddp_fp16` (docs/chapters/ch08.md, 尚未解释的读数): the same training as
the tutorial's part 3 (tiny, FP32 + AdamW, 2 gloo ranks, b2 s32, 4 steps) for `ddp` and `ddp_fp16`, repeated,
printing each rank's per-step peak and the allocated bytes at the start of each step, plus the largest
non-parameter, non-optimizer-state tensors alive at the peak when it is above `ddp`'s:
    .venv/bin/python scripts/probes/ch08_ddp_fp16_peak_variation.py [TRIALS]
Whether a rank's step peaks 0.5 MiB higher changes from run to run: it depends on thread timing, not on
the code path.
"""
import datetime
import gc
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vramlab
from vramlab.models import build_model
from vramlab.units import MiB


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(kind, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        m = DDP(build_model("tiny"))
        m.register_comm_hook(None, default_hooks.fp16_compress_hook if kind == "ddp_fp16"
                             else default_hooks.allreduce_hook)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(100 + rank)
        rows = []
        for step in range(4):
            ids = torch.randint(0, 1000, (2, 32), generator=gen)
            gc.collect()
            dev.reset_peak()
            start = dev.allocated()
            m(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            extra = sorted(((r.nbytes, r.op, r.where) for r in dev.tracker.peak_records
                            if r.label not in ("parameters", "optimizer_state")), reverse=True)[:3]
            rows.append((step, round(start / MiB, 3), round(dev.max_allocated() / MiB, 3), dev.tracker.peak_where, extra))
        del m, opt
    return rows


def worker(rank, world, port, kind, queue):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        queue.put((rank, train(kind, rank, world)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(kind, world=2):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    pc = mp.start_processes(worker, args=(world, free_port(), kind, queue), nprocs=world, start_method="fork", join=False)
    out = dict(queue.get(timeout=300) for _ in range(world))
    pc.join()
    return out


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {datetime.date.today()}, simulated device; MiB = max_allocated per step")
    for trial in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        for kind in ("ddp", "ddp_fp16"):
            out = run(kind)
            for rank in (0, 1):
                print(f"trial {trial} {kind:9s} rank {rank}: step peaks", [r[2] for r in out[rank]],
                      " start-of-step", [r[1] for r in out[rank]], flush=True)
                for step, start, peak, where, extra in out[rank]:
                    if peak > 12.4:
                        print(f"      step {step} peak {peak} at {where}; largest non-state tensors {extra}")
