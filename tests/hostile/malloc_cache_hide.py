# expect: tamper|forbidden
# 读过 vramlab/grader/policy.py 的学员：不由进程外读数判分的题型会调用 cache_freed_memory()，让 glibc 缓存释放的内存。
# 在要读数的题里自己调用它，先在主存里分配又释放一大块（让堆先长大、常驻内存先计一次），再把保存给反向的激活值
# 藏进 numpy，指望它们落进那块已被缓存、已计过的空闲内存里，常驻内存的峰值不再上涨。
# Turn on glibc's cache the way the grader does for unobserved kinds, pre-grow the heap, then hide
# saved activations in numpy arrays that land in the cached free space. The grader module is taken
# from sys.modules (`import vramlab.grader` is refused); its mallopt goes through ctypes (refused as
# native code). Past those guards (not measured) the observer should still see it: the 96 MiB of
# scratch is untracked memory that raises the resident peak by itself.
import numpy as np
import torch

import sys

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy


def _pack(t):
    return _host_view(t.detach()).copy()


def _unpack(a):
    return torch.from_numpy(a)


def train_step(model, optimizer, batch, device):
    sys.modules["vramlab.grader.policy"].cache_freed_memory()
    scratch = [np.ones(1 << 20, dtype=np.float32) for _ in range(24)]     # 24 x 4 MiB, then freed
    del scratch
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
