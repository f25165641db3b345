# expect: incorrect
# 反例：重置、运行、读峰值都对了，却减去了调用之前的已分配显存，返回的是“多出来的部分”，
# 不是题目要的绝对峰值（模型参数和优化器状态都被减掉了）。
def measure_peak(fn, device):
    before = device.allocated()
    device.reset_peak()
    fn()
    return device.max_allocated() - before
