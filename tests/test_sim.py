"""The simulated device: exact byte counts, attribution, CUDA emulation, budget, fidelity."""
import gc

import pytest
import torch

import vramlab
from vramlab.models import build_model
from vramlab.reference import reference_rows
from vramlab.runner import build_training, measure_workload
from vramlab.sim.allocator import CachingAllocatorModel
from vramlab.sim.device import CUBLAS_WORKSPACE_BYTES, SimDevice
from vramlab.units import MiB, parse_bytes, round_block
from vramlab.workload import Workload, from_reference_name


def test_exact_bytes_for_known_ops():
    with SimDevice(cublas_workspace=False) as dev:
        a = torch.empty(1000)                     # 4000 B -> one 512-B multiple above: 4096
        assert dev.allocated() == 4096
        b = a.view(10, 100)                       # a view shares the storage
        a.add_(1)                                 # in place: no new storage
        assert dev.allocated() == 4096
        c = torch.empty(1, dtype=torch.int8)      # the smallest block is 512 B
        assert dev.allocated() == 4096 + 512
        d = a + 1                                 # a new storage of the same size
        assert dev.allocated() == 2 * 4096 + 512
        del a, b                                  # the storage dies with its last tensor
        assert dev.allocated() == 4096 + 512
        del c, d
        assert dev.allocated() == 0
        assert dev.max_allocated() == 2 * 4096 + 512
        e = torch.empty(0)                        # empty tensors allocate nothing
        m = torch.empty(1 << 20, device="meta")   # nor do meta tensors (shapes only)
        assert dev.allocated() == 0
        del m
        dev.reset_peak()
        assert dev.max_allocated() == 0
        del e


def test_storage_resize_in_place_is_charged():
    """FSDP2 frees gathered parameters with untyped_storage().resize_(0) and refills them later."""
    with SimDevice(cublas_workspace=False) as dev:
        t = torch.empty(1 << 20)
        t.untyped_storage().resize_(0)
        assert dev.allocated() == 0
        t.untyped_storage().resize_(4 << 20)
        assert dev.allocated() == 4 << 20
        del t
        assert dev.allocated() == 0


def test_tensors_outside_the_device_are_not_counted():
    outside = torch.empty(1 << 20)
    with SimDevice() as dev:
        y = outside[:10]
        assert dev.allocated() == 0
        dev.adopt(outside)                        # like outside.to("cuda")
        assert dev.allocated() == round_block(outside.nbytes)
        del y


def test_allocator_model_matches_cuda_rules():
    a = CachingAllocatorModel()
    small = a.malloc(100)
    assert (small.size, a.reserved) == (512, 2 * MiB)          # small pool: 2 MiB segments
    mid = a.malloc(5 * MiB)
    assert a.reserved == 2 * MiB + 20 * MiB                     # < 10 MiB: a 20 MiB segment
    big = a.malloc(int(19.5 * MiB))
    assert big.size == 20 * MiB                                 # a 0.5 MiB remainder is not split off
    a.free(mid)
    reuse = a.malloc(3 * MiB)                                   # best fit reuses the cached block
    assert reuse.addr == mid.addr and a.reserved == 42 * MiB
    for blk in (reuse, small, big):
        a.free(blk)
    assert a.allocated == 0 and a.empty_cache() == 42 * MiB and a.reserved == 0


def _train_tiny(dev, steps=2):
    model = build_model("tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, ids


def test_attribution_of_parameters_gradients_and_optimizer_state():
    with SimDevice() as dev:
        model, opt, ids = _train_tiny(dev)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()                                   # labels state and grads via the optimizer hooks
        now = dev.breakdown(at_peak=False)
        params = list(model.parameters())
        assert now["parameters"] == sum(round_block(p.nbytes) for p in params)
        assert now["gradients"] == sum(round_block(p.grad.nbytes) for p in params)
        moments = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
        assert len(moments) == 2 * len(params)
        # AdamW's `step` counters are host tensors (torch.tensor(0.)) unless capturable/fused,
        # on CUDA as here, so only the two moments are device memory.
        assert now["optimizer_state"] == sum(round_block(t.nbytes) for t in moments)
        assert now["cuda_overhead"] == 2 * CUBLAS_WORKSPACE_BYTES   # forward and backward thread


def test_activations_are_what_backward_keeps():
    with SimDevice(cublas_workspace=False) as dev:
        model = build_model("tiny")
        ids = torch.randint(0, 1024, (4, 128))
        base = dev.allocated()
        loss = model(input_ids=ids, labels=ids).loss
        kept = dev.allocated() - base
        peak_forward = dev.breakdown(at_peak=False)["activations"]
        assert kept > 0 and peak_forward > 0
        loss.backward()
        del loss
        gc.collect()
        # after backward only gradients and parameters remain
        assert dev.allocated() - base == sum(round_block(p.grad.nbytes) for p in model.parameters())


def test_peak_breakdown_sums_to_peak():
    m = measure_workload(Workload(model="tiny", batch=2, seq=64), backend="sim")
    assert sum(m.breakdown.values()) == m.peak_bytes
    assert m.breakdown["activations"] > 0 and m.breakdown["optimizer_state"] > 0


def test_fake_and_real_tensors_agree():
    w = Workload(model="tiny", batch=4, seq=128, dropout=0.1)
    real = measure_workload(w, backend="sim", fake=False)
    fake = measure_workload(w, backend="sim", fake=True)
    assert abs(real.peak_bytes - fake.peak_bytes) <= 0.01 * real.peak_bytes
    assert abs(real.first_step_peak_bytes - fake.first_step_peak_bytes) <= 0.01 * real.first_step_peak_bytes


def test_sdpa_is_accounted_as_the_cuda_kernel_not_the_cpu_math_path():
    """With attention dropout the CPU runs SDPA's math path and keeps [L, L] scores per head;
    the CUDA memory-efficient kernel keeps only q, k, v, out and a log-sum-exp."""
    base = Workload(model="tiny", batch=4, seq=256)
    no_drop = measure_workload(base, fake=True).peak_bytes
    drop = measure_workload(Workload(model="tiny", batch=4, seq=256, dropout=0.1), fake=True).peak_bytes
    eager = measure_workload(Workload(model="tiny", batch=4, seq=256, attention="eager"), fake=True).peak_bytes
    p = build_model("tiny").config
    scores_per_layer = 4 * p.n_head * 256 * 256 * 4
    # dropout adds bool masks (1 byte/element) on hidden-sized tensors, never score matrices
    assert drop - no_drop < scores_per_layer
    assert eager - no_drop >= 0.75 * p.n_layer * scores_per_layer   # eager keeps one fp32 [L, L] softmax per head


def test_cuda_autocast_policy_and_weight_cast_cache():
    with SimDevice(cublas_workspace=False) as dev:
        lin = torch.nn.Linear(256, 256)
        x = torch.randn(8, 256)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            y1 = lin(x)
            before = dev.allocated()
            y2 = lin(x)
            # second call: only the bf16 input copy and output are new, the bf16 weight is cached
            assert dev.allocated() - before == round_block(8 * 256 * 2) * 2
            assert y1.dtype == torch.bfloat16
            assert torch.pow(y1, 3.0).dtype == torch.float32           # pow runs in fp32 on CUDA
            assert torch.nn.functional.layer_norm(y1, (256,)).dtype == torch.float32
            assert torch.softmax(y1, -1).dtype == torch.float32
            assert (y1 + y2).dtype == torch.bfloat16                     # not listed: no cast
        assert lin.weight.dtype == torch.float32


def test_save_on_cpu_moves_activations_off_the_device():
    w = Workload(model="tiny", batch=4, seq=256)
    plain = measure_workload(w, fake=True)
    offloaded = measure_workload(Workload(model="tiny", batch=4, seq=256, offload="activations"), fake=True)
    assert offloaded.breakdown["activations"] < 0.1 * plain.breakdown["activations"]
    assert offloaded.peak_bytes < plain.peak_bytes


def test_budget_raises_cuda_like_oom_and_the_process_recovers():
    with vramlab.device_budget("128 MiB", backend="sim") as dev:
        model = build_model("tiny")
        big = torch.randint(0, 1024, (64, 512))
        with pytest.raises(torch.OutOfMemoryError) as err:
            model(input_ids=big, labels=big).loss.backward()
        msg = str(err.value)
        assert "CUDA out of memory" in msg and "显存预算" in msg and "128.00 MiB" in msg
        del err
        gc.collect()
        small = big[:2, :64]
        model(input_ids=small, labels=small).loss.backward()      # the same process trains on
        assert dev.max_allocated() <= parse_bytes("128 MiB")
    with SimDevice() as dev:                                        # a budget applies to an active device
        with vramlab.device_budget("1 MiB"):
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(1 << 20)
        torch.empty(1 << 20)                                        # and is lifted afterwards


def test_measure_callable_and_with_block_agree():
    def fn():
        a = torch.empty(1 << 20)
        b = torch.empty(1 << 20)
        del a, b
    m1 = vramlab.measure(fn, backend="sim")
    with vramlab.measure(backend="sim") as m2:
        fn()
    assert m1.peak_bytes == m2.peak_bytes == 2 * 4 * MiB


@pytest.mark.slow
@pytest.mark.parametrize("row", reference_rows(), ids=lambda r: r.name)
def test_sim_reproduces_h200_reference_within_3_percent(row):
    """Every row of vramlab/data/h200_gpt2_peaks.md, under FakeTensorMode (seconds each)."""
    m = measure_workload(from_reference_name(row.name), backend="sim", fake=True)
    ratio = m.peak_bytes / MiB / row.steady_mib
    assert abs(ratio - 1) <= 0.03, f"{row.name}: sim {m.peak_bytes / MiB:.0f} MiB vs H200 {row.steady_mib}"
    assert m.trainable_params == row.trainable_params or from_reference_name(row.name).inference


def test_build_training_rejects_multi_gpu_in_one_process():
    from vramlab.workload import WorkloadError
    with SimDevice() as dev, pytest.raises(WorkloadError):
        build_training(Workload(model="tiny", zero=2, gpus=4), dev)


def test_device_memory_has_no_host_view_as_on_cuda():
    """Every zero-copy host view of a device tensor raises CUDA's TypeError on the simulated device
    (on a GPU numpy() raises and a DLPack capsule points at memory no host library can read), also
    inside saved-tensor hooks, which run inside an op where a function mode is off; a host copy
    has them, and leaving the device restores torch's own methods."""
    import numpy as np
    import torch.utils.dlpack

    before = {n: getattr(torch.Tensor, n) for n in ("numpy", "__array__", "__dlpack__")}
    routes = {
        "numpy": lambda t: t.numpy(), "view": lambda t: t[1:].numpy(), "np.asarray": np.asarray,
        "np.array": np.array, "np.from_dlpack": np.from_dlpack, "__dlpack__": lambda t: t.__dlpack__(),
        "utils.dlpack.to_dlpack": lambda t: torch.utils.dlpack.to_dlpack(t), "torch.to_dlpack": lambda t: torch.to_dlpack(t),
    }
    with SimDevice() as dev:
        t = torch.ones(64, device=dev.torch_device, requires_grad=True)
        for name, route in routes.items():
            with pytest.raises(TypeError, match="can't convert cuda"):
                route(t.detach())
            route(dev.to_host(t.detach()))                    # a host copy: allowed
        refused = []

        def pack(x):
            try:
                x.numpy()
            except TypeError:
                refused.append(True)
            return x
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            (t * t).sum()
        assert refused and all(refused)
    assert {n: getattr(torch.Tensor, n) for n in before} == before and "numpy" not in torch.Tensor.__dict__
    assert torch.ones(3).numpy().sum() == 3
