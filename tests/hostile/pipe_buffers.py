# expect: tamper
# 把保存给反向的激活值塞进管道：每个张量一组管道，fcntl(F_SETPIPE_SZ) 把缓冲区放大到 1 MiB，
# 写进去、反向时再读出来。管道缓冲区是内核内存，不在进程的地址空间里：常驻内存看不见；内核把它记在
# 进程的内存 cgroup（kmem）上（issue 28）。
# Saved activations parked in pipe buffers enlarged with F_SETPIPE_SZ.
import fcntl
import os

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy

F_SETPIPE_SZ = 1031
CHUNK = 1 << 20


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    pipes = []
    for i in range(0, len(data), CHUNK):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, CHUNK)
        except OSError:
            pass
        piece = memoryview(data)[i:i + CHUNK]
        os.set_blocking(w, False)
        while piece:
            piece = piece[os.write(w, piece):]
        pipes.append((r, w, min(CHUNK, len(data) - i)))
    return pipes, t.shape, t.dtype, t.device


def _unpack(packed):
    pipes, shape, dtype, device = packed
    raw = bytearray()
    for r, w, n in pipes:
        while n:
            got = os.read(r, n)
            raw += got
            n -= len(got)
    if not raw:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).to(device)


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
