# expect: exception|incorrect
# 只对看到的配置成立：在主存里查表，但先把 ids 拉平、查完再按看到的形状 (8, 256, 256) 写死地还原。
# 隐藏配置的批大小、序列长度和宽度不同，还原时就出错了。
import torch


def embed(ids, table, device):
    flat = device.to_host(ids).reshape(-1)
    with device.host():
        rows = table[flat].view(8, 256, 256)
    return device.to_device(rows)
