# expect: too_much_memory
# 只对看到的配置成立：看到的请求按到达顺序逐个变长，于是倒着处理（结果放回原下标）就等于先处理最长的。
# 隐藏配置的到达顺序是打乱的，倒序不再是从长到短，差值降不下来。
import torch


def process(requests, weight, device):
    outputs = [None] * len(requests)
    for i in reversed(range(len(requests))):
        x = device.to_device(requests[i])
        h = torch.relu(x @ weight)
        outputs[i] = h @ weight.T
    return outputs
