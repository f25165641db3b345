"""Probe behind chapter 8's note on PowerSGD over gloo (docs/chapters/ch08.md): DDP + powerSGD_hook
(rank 1, start_powerSGD_iter=2) on `tiny`, 2 gloo ranks, logging every all_reduce the hook issues (iteration,
element count) on each rank until the run fails:
    .venv/bin/python scripts/probes/ch08_powersgd_gloo_order.py
The hook issues its P and Q all-reduces inside Future.then callbacks. Over gloo a callback runs on the
process group's worker thread when the previous all-reduce completes, so once two buckets are in flight the
two ranks can issue their collectives in different orders; gloo pairs collectives by order and aborts
("Received data size doesn't match expected size"). Whether and when it happens depends on thread timing.
"""
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vramlab.models import build_model


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port):
    import warnings
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    m = DDP(build_model("tiny"))
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    m.register_comm_hook(state, ps.powerSGD_hook)
    real = dist.all_reduce

    def logged(t, *args, **kwargs):      # which collective this rank issues, in its own order
        print(f"rank {rank} iter {state.iter} all_reduce numel={t.numel()}", flush=True)
        return real(t, *args, **kwargs)
    ps.dist.all_reduce = logged
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)
    try:
        for step in range(6):
            ids = torch.randint(0, 1000, (2, 32), generator=gen)
            m(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            print(f"rank {rank} step {step} done", flush=True)
    except Exception as e:  # the peer usually aborts first; this rank then sees a closed connection
        print(f"rank {rank} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {datetime.date.today()}")
    try:
        mp.start_processes(worker, args=(2, free_port()), nprocs=2, start_method="fork")
    except mp.ProcessExitedException as e:
        print("a rank exited abnormally:", e)
