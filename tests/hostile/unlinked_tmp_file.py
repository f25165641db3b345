# expect: tamper
# 把保存给反向的激活值写进 /tmp 里一个打开后立即删除的文件，通过 mmap 窗口写、反向时 pread 读回：
# 没有名字，扫描目录找不到；写入的页留在页缓存里。内核把页缓存记在进程的内存 cgroup 上（issue 28）。
# Saved activations in an unlinked file in /tmp, written through mmap windows.
import mmap
import os
import tempfile

import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    t = t.detach().contiguous()
    data = _host_view(t.cpu().reshape(-1).view(torch.uint8)).tobytes() if t.numel() else b""
    fd, path = tempfile.mkstemp()
    os.unlink(path)
    if data:
        os.ftruncate(fd, len(data))
        with mmap.mmap(fd, len(data)) as window:
            window[:] = data
    return fd, t.shape, t.dtype, len(data), t.device


def _unpack(packed):
    fd, shape, dtype, size, device = packed
    if not size:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = bytearray(os.pread(fd, size, 0))
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).to(device)


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
