import gc

import torch


def find_max_batch(model, optimizer, make_batch, device):
    """试探 = 完整的一步训练（前向、反向、优化器更新）：AdamW 的状态在第一次 step() 时才分配，
    只做前向和反向会高估。OOM 之后先离开 except 块，再丢掉这次试探的所有引用，最后整理缓存。
    搜索：先翻倍找到第一个放不下的 batch，再二分。"""
    def fits(n):
        batch = make_batch(n)
        loss, oom = None, False
        try:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
        except torch.OutOfMemoryError:
            oom = True                      # 只做标记：异常还拉着出错时的栈帧
        loss = batch = None                 # 离开 except 块之后再清理
        optimizer.zero_grad(set_to_none=True)
        if oom:
            gc.collect()
            device.empty_cache()
        return not oom

    good, bad = 0, 1
    while fits(bad):                        # 1, 2, 4, 8, ... 直到放不下
        good, bad = bad, bad * 2
    while bad - good > 1:                   # 不变式：good 放得下（或为 0），bad 放不下
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
