# expect: incorrect
# 针对看得到的配置写死的答案：在 80 MiB 的卡上试出了 21，就只在 20 到 22 之间确认一下
# （先在 batch 1 上走一步，让优化器状态先分配好）。试探和清理都是对的，但隐藏配置换了层数和显存预算，
# 最大 batch 不在这个范围里。
import torch


def find_max_batch(model, optimizer, make_batch, device):
    def fits(n):
        batch = make_batch(n)
        loss, oom = None, False
        try:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
        except torch.OutOfMemoryError:
            oom = True
        loss = batch = None
        optimizer.zero_grad(set_to_none=True)
        return not oom

    fits(1)
    for n in (22, 21, 20):
        if fits(n):
            return n
    return 1
