"""Probe behind chapter 8's note on the hook variant's extra 0.5 MiB (docs/chapters/ch08.md, 补充核对):
allocated bytes at the start of each step for param / hook / hook_sync all-reduce, two ranks over gloo:
    .venv/bin/python scripts/probes/ch08_hook_gradient_lifetime.py
"""
import os, socket, gc
import torch, torch.distributed as dist, torch.multiprocessing as mp
import vramlab
from vramlab.models import build_model
from vramlab.units import MiB

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def train(kind, rank, world):
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        torch.manual_seed(0)
        model = build_model("tiny")
        params = list(model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        works = []
        if kind.startswith("hook"):
            def on_grad(p):
                if kind == "hook_sync":
                    dist.all_reduce(p.grad)
                else:
                    works.append(dist.all_reduce(p.grad, async_op=True))
            for p in params:
                p.register_post_accumulate_grad_hook(on_grad)
        gen = torch.Generator().manual_seed(100 + rank)
        for step in range(3):
            ids = torch.randint(0, 1000, (2, 32), generator=gen)
            gc.collect(); dev.reset_peak()
            start = dev.allocated()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if kind == "param":
                for p in params:
                    dist.all_reduce(p.grad); p.grad.div_(world)
            else:
                for w in works: w.wait()
                works.clear()
                if kind == "hook_flush":
                    with dev.untracked():
                        dist.all_reduce(torch.zeros(1))
                for p in params: p.grad.div_(world)
            opt.step(); opt.zero_grad()
            if rank == 0:
                recs = sorted(((r.nbytes, r.op, r.where, r.phase, r.label) for r in dev.tracker.peak_records), reverse=True)
                print(kind, "step", step, "start", round(start/MiB,3), "peak", round(dev.max_allocated()/MiB, 3), dev.tracker.peak_where, flush=True)
                if False:
                    for x in recs:
                        if x[4] not in ("parameters", "optimizer_state") : print("   ", x)
        # what is alive at the start of a step that is not param/state?

def worker(rank, world, port):
    import warnings; warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for kind in ("hook", "hook_flush", "hook_sync"):
        train(kind, rank, world)
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(worker, args=(2, free_port()), nprocs=2, start_method="fork")
