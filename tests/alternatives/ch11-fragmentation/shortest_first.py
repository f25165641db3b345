# expect: too_much_memory
# 排序用错了方向：按长度升序处理。这正是起始代码的到达顺序，每个请求都比缓存里的空闲块稍大一点，
# 差值几乎不变。
import torch


def process(requests, weight, device):
    outputs = [None] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: requests[i].shape[0]):
        x = device.to_device(requests[i])
        h = torch.relu(x @ weight)
        outputs[i] = h @ weight.T
    return outputs
