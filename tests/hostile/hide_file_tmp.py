# expect: tamper|forbidden
# 把激活值藏进 /tmp 里的文件：saved_tensors_hooks 的 pack 用 torch.save 把保存给反向的张量写成
# /tmp 里的文件（tmpfs 上就是内存，但不算进进程的 RSS），unpack 在反向时 torch.load 读回来再删掉。同一步里写、同一步里读，
# 激活值在前向到反向之间不在"显存"里。在模拟设备上这等于把激活值卸载到主存/磁盘，本题不允许。
# Saved-tensor hooks that torch.save activations to files in /tmp and torch.load them back.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：被拦住（forbidden），但只拦住了 os.remove：torch.save 在 C++ 里打开文件，不经过审计，文件已经写进了 /tmp。
import itertools
import os

import torch

_n = itertools.count()


def _pack(t):
    path = f"/tmp/vramlab-hide-{os.getpid()}-{next(_n)}.pt"
    torch.save(t.detach().clone(), path)
    return path


def _unpack(path):
    t = torch.load(path)
    os.remove(path)
    return t


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
