# expect: pass
# 另一种读法：重置峰值后运行 fn，再从 memory_stats() 里读已分配显存的峰值
# （键名与 torch.cuda.memory_stats() 相同），转成整数返回。
def measure_peak(fn, device):
    device.reset_peak()
    fn()
    return int(device.memory_stats()["allocated_bytes.all.peak"])
