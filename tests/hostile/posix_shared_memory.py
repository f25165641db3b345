# expect: tamper|forbidden
# 把保存给反向的激活值放进 POSIX 共享内存（multiprocessing.shared_memory，即 /dev/shm 里的文件），
# 写完立即关掉映射，反向时再打开读回。内核把这些页记在进程的内存 cgroup 上（issue 28）。
# Saved activations in POSIX shared memory segments, unmapped between pack and unpack.
from multiprocessing import shared_memory

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    if not data:
        return None, t.shape, t.dtype, 0, t.device
    shm = shared_memory.SharedMemory(create=True, size=len(data))
    shm.buf[:len(data)] = data
    name = shm.name
    shm.close()
    return name, t.shape, t.dtype, len(data), t.device


def _unpack(packed):
    name, shape, dtype, size, device = packed
    if not size:
        return torch.empty(shape, dtype=dtype, device=device)
    shm = shared_memory.SharedMemory(name=name)
    raw = bytearray(shm.buf[:size])
    shm.close()
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).to(device)


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
