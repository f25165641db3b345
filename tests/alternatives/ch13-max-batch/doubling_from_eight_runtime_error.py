# expect: pass
# 另一种写法：先在 batch 1 上走一步（让 AdamW 的状态先分配好），再从 8 开始翻倍找第一个放不下的 batch，然后二分。
# 显存不足用更宽的 RuntimeError 接住、看消息里有没有 "out of memory"（旧版 PyTorch 的写法）；异常只做标记，
# 清理放在 finally 之后、except 块之外。不调用 empty_cache：放不下的那次的张量引用全部丢掉就够了。
import torch


def find_max_batch(model, optimizer, make_batch, device):
    def step_fits(n):
        ids = make_batch(n)
        out = None
        failed = False
        try:
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            optimizer.step()
        except RuntimeError as e:
            if "out of memory" not in str(e):
                raise
            failed = True
        finally:
            optimizer.zero_grad(set_to_none=True)
        del ids, out
        return not failed

    step_fits(1)
    lo, hi = 1, 8
    while step_fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
