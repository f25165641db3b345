"""Probe behind chapter 10's note on FSDP2's extra 2.27 MiB on the simulated device (docs/chapters/ch10.md,
补充核对): prints how many bytes the tracker books for AdamW's exp_avg of a sharded (DTensor) parameter
against its local shard. Two ranks over gloo on this machine:  .venv/bin/python scripts/probes/ch10_fsdp_optimizer_state.py
"""
import os, socket, sys, gc
import torch, torch.distributed as dist, torch.multiprocessing as mp
import vramlab
from vramlab.models import build_model
from vramlab.units import MiB

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def worker(rank, world, port):
    import warnings; warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import fully_shard
    with vramlab.SimDevice(cublas_workspace=False) as dev:
        model = build_model("tiny")
        for block in model.transformer.h:
            fully_shard(block, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(100 + rank)
        for step in range(2):
            ids = torch.randint(0, 1000, (4, 64), generator=g)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            if rank == 0:
                print("after backward step", step, round(dev.allocated()/MiB, 3), flush=True)
            opt.step()
            if step < 1: opt.zero_grad(set_to_none=True)
        if rank == 0:
            gc.collect()
            print("allocated", dev.allocated()/MiB)
            keys = {}
            for p in model.parameters():
                keys[p.to_local().untyped_storage()._cdata] = "param"
                if p.grad is not None: keys[p.grad.to_local().untyped_storage()._cdata] = "grad"
            for st in opt.state.values():
                for v in st.values():
                    if torch.is_tensor(v) and v.dim() > 0:
                        keys[(v.to_local() if hasattr(v, "to_local") else v).untyped_storage()._cdata] = "state"
            from collections import Counter
            lab = Counter(); n = Counter()
            for k, r in dev.tracker.live.items():
                lab[r.label] += r.charged; n[r.label] += 1
            print("by label", {k: (round(v/MiB, 3), n[k]) for k, v in lab.items()})
            st0 = next(iter(opt.state.values()))
            v = st0["exp_avg"]
            print(type(v), v.shape, v.to_local().shape)
            try:
                ws = v.untyped_storage(); print("wrapper storage nbytes", ws.nbytes(), ws._cdata in dev.tracker.live)
            except Exception as e: print("wrapper storage err", e)
            ls = v.to_local().untyped_storage(); print("local storage nbytes", ls.nbytes(), ls._cdata in dev.tracker.live)
            tot = {}
            for k, r in dev.tracker.live.items():
                kind = keys.get(k, "OTHER")
                tot[kind] = tot.get(kind, 0) + r.charged
                if kind == "OTHER" and r.label != "optimizer_state":
                    print("  OTHER", r.nbytes, r.charged, r.op, r.where, r.phase, r.label)
            print({k: round(v/MiB, 3) for k, v in tot.items()})
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(worker, args=(2, free_port()), nprocs=2, start_method="fork")
