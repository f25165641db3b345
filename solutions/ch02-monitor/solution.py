def measure_peak(fn, device):
    """峰值计数器会一直记着历史最高值：先把它重置为当前已分配的量，再运行 fn，
    最后读出这段时间里的最高值（绝对值，包含调用前已经占用的显存）。"""
    device.reset_peak()
    fn()
    return device.max_allocated()
