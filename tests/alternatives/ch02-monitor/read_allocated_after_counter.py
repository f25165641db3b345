# expect: incorrect
# 反例：重置了峰值，却在 fn 返回之后读当前已分配显存，而不是峰值：临时张量已经释放，读数偏低。
def measure_peak(fn, device):
    device.reset_peak()
    fn()
    return device.allocated()
