# expect: tamper
# 同 memfd_mmap_window，但用 os.write / os.pread 写读匿名内存文件（memfd），完全不映射：常驻内存里从来
# 没有这些页，写入的字节却计入 wchar。内核把 memfd 的页记在进程的内存 cgroup 上（issue 28）。
# Saved activations written into memfds with write() and read back with pread().
import os

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    fd = os.memfd_create("act")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return fd, t.shape, t.dtype, len(data), t.device


def _unpack(packed):
    fd, shape, dtype, size, device = packed
    raw = bytearray(os.pread(fd, size, 0)) if size else bytearray()
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).to(device) if size else \
        torch.empty(shape, dtype=dtype, device=device)


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
