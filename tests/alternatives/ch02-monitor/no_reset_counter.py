# expect: incorrect
# 反例（只修了一半）：读的是峰值，但没有先重置。调用之前留下的更高的峰值还在计数器里，
# 读出来的是那个旧峰值，不是 fn 运行期间的。
def measure_peak(fn, device):
    fn()
    return device.max_allocated()
