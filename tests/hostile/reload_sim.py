# expect: tamper|forbidden
# importlib.reload 拿到没被包装的函数：评分器在运行学员代码前把 SimDevice / StorageTracker 的
# reset_peak 等方法换成了会记违规的包装。reload vramlab.sim.tracker、vramlab.sim.device、vramlab.meter
# 会重新执行模块源码，得到一套全新的、没被包装的类；拿到后立即把模块字典恢复原样（不改动任何被检查的
# 东西）。反向之后用新类的 reset_peak 作用在评分器的计量器上，丢掉激活值的峰值。训练本身是起始代码的显存。
# importlib.reload the simulator modules for unwrapped methods, then reset the peak after backward.
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破（满分）：重新加载出的函数与原函数的代码对象相等，守卫把它当成可信代码。
import importlib

import torch
import vramlab.meter
import vramlab.sim.device
import vramlab.sim.tracker


def _fresh():
    out = {}
    for mod in (vramlab.sim.tracker, vramlab.sim.device, vramlab.meter):
        saved = dict(mod.__dict__)
        try:
            importlib.reload(mod)
            out[mod.__name__] = dict(mod.__dict__)
        finally:
            mod.__dict__.clear()
            mod.__dict__.update(saved)
    return out


FRESH = _fresh()
FreshTracker = FRESH["vramlab.sim.tracker"]["StorageTracker"]
FreshDevice = FRESH["vramlab.sim.device"]["SimDevice"]


def train_step(model, optimizer, batch, device):
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    tracker = getattr(device, "tracker", None)
    if tracker is not None:
        FreshTracker.reset_peak(tracker)
    else:
        FreshDevice.reset_peak(device)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
