# expect: pass
# 每个 batch 连续试 2 个完整的训练步（本章“第一步陷阱”的建议），异常只做标记，离开 except 块后
# 用 del 丢掉引用、清梯度、回收；搜索用 lo/hi 区间写成一个循环：先翻倍，再二分。
import gc

import torch


def probe(model, optimizer, make_batch, n, steps=2):
    for _ in range(steps):
        batch = make_batch(n)
        out = None
        failed = False
        try:
            out = model(input_ids=batch, labels=batch)
            out.loss.backward()
            optimizer.step()
        except torch.OutOfMemoryError:
            failed = True
        del out, batch
        optimizer.zero_grad(set_to_none=True)
        if failed:
            gc.collect()
            return False
    return True


def find_max_batch(model, optimizer, make_batch, device):
    lo, hi = 0, None                 # lo 放得下（0 表示还没有），hi 放不下（None 表示还没找到）
    n = 1
    while hi is None or hi - lo > 1:
        if probe(model, optimizer, make_batch, n):
            lo = n
        else:
            hi = n
        n = n * 2 if hi is None else (lo + hi) // 2
    return lo
