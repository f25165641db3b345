# expect: tamper|forbidden
# 把保存给反向的激活值留在套接字的接收缓冲区里：socketpair，放大 SO_SNDBUF/SO_RCVBUF，写进去、
# 反向时再读出来。套接字缓冲区是内核内存：常驻内存看不见，内核把它记在内存 cgroup 上（issue 28）。
# 单进程的题里创建 socket 本身就被拒绝（Python 防护先报 forbidden，内核的 seccomp 过滤器也不放行）。
# Saved activations parked in socket buffers.
import socket

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    a.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            sent += a.send(memoryview(data)[sent:])
    except BlockingIOError:
        return ("host", data, t.shape, t.dtype, t.device, a, b)     # did not fit: keep the rest plainly
    return ("sock", len(data), t.shape, t.dtype, t.device, a, b)


def _unpack(packed):
    how, data, shape, dtype, device, a, b = packed
    if how == "sock":
        n, raw = data, bytearray()
        while len(raw) < n:
            raw += b.recv(n - len(raw))
    else:
        raw = bytearray(data)
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
