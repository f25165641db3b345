# expect: incorrect
# 反例（只修了一半）：试探是完整的训练步，OOM 也接住了，但放不下之后什么都不清理：
# 失败那次的 loss 还挂在外层变量上、引用着整张计算图，已经算出的一部分梯度也还在。
# 下一次试探开始时这些显存都还占着，搜出来的 batch 偏小。
import torch


def find_max_batch(model, optimizer, make_batch, device):
    state = {}

    def fits(n):
        try:
            state["batch"] = make_batch(n)
            state["loss"] = model(input_ids=state["batch"], labels=state["batch"]).loss
            state["loss"].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return True
        except torch.OutOfMemoryError:
            return False

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
