# expect: tamper
# 把保存给反向的激活值藏进匿名内存文件（memfd）：pack 为每个张量 os.memfd_create 一个文件，通过一个
# mmap 窗口写进去，随即关掉窗口；unpack 再映射回来复制成张量。没有映射的页不算进常驻内存（VmHWM），
# 通过映射写入的字节也不算“写出”（wchar / write_bytes）：旧的进程外读数看不见它们。内核仍把这些页记在
# 进程的内存 cgroup 上：评分器读 cgroup 的峰值。
# Saved activations parked in memfds through short-lived mmap windows (issue 28).
import mmap
import os

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    fd = os.memfd_create("act")
    if data:
        os.ftruncate(fd, len(data))
        with mmap.mmap(fd, len(data)) as window:
            window[:] = data
    return fd, t.shape, t.dtype, len(data), t.device


def _unpack(packed):
    fd, shape, dtype, size, device = packed
    if not size:
        return torch.empty(shape, dtype=dtype, device=device)
    with mmap.mmap(fd, size) as window:
        raw = bytearray(window[:])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).to(device)


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
