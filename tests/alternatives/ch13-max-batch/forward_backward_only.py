# expect: incorrect
# 反例：试探只做前向和反向，不做优化器更新（OOM 的捕获和清理都是对的，搜索也是倍增加二分）。
# AdamW 的一阶矩、二阶矩要到第一次 step() 才分配，这样搜出来的 batch 偏大，评分器用完整的训练步复查时放不下。
import torch


def find_max_batch(model, optimizer, make_batch, device):
    def fits(n):
        batch = make_batch(n)
        loss, oom = None, False
        try:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
        except torch.OutOfMemoryError:
            oom = True
        loss = batch = None
        optimizer.zero_grad(set_to_none=True)
        return not oom

    good, bad = 0, 1
    while fits(bad):
        good, bad = bad, bad * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
