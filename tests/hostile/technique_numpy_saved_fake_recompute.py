# expect: tamper|forbidden
# exercise: ch07-checkpoint
# 伪造激活检查点并把激活值藏到设备之外：自己的 saved_tensors_hooks 把评分器的挡在外面，pack 把每个保存的
# 张量复制进 numpy（设备上的那份随之释放，反向开始时设备上确实没留下什么），unpack 再变回来，顺手调用一次
# block 的子模块冒充重算。旧评分器上：方法判为检查点，峰值也低（issue 28 用 memfd 做到满分）。
# 现在：方法这一关过得去（设备上真的没有），但内存一点没少，只是到了主存：进程外的内存读数看得见，判为干扰计量。
import torch

# Tensor.numpy() of a device tensor raises on the simulated device as on CUDA; the C method under it
# does not (docs/dev/limitations.md): past that Python rule, the kernel's accounting must catch this.
_host_view = torch._C.TensorBase.numpy

_block = None


def _pack(t):
    return _host_view(t.detach()).copy()


def _unpack(a):
    if _block is not None:
        _block.ln_1(torch.zeros(1, _block.ln_1.normalized_shape[0]))
    return torch.from_numpy(a)


def train_step(model, optimizer, batch, device):
    global _block
    _block = model.transformer.h[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
