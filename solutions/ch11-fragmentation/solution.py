import torch


def process(requests, weight, device):
    """先处理最长的请求：第一次就申请到最大的块，之后更短的请求都能在缓存里复用它们。
    结果按原来的顺序放回列表。"""
    outputs = [None] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: -requests[i].shape[0]):
        x = device.to_device(requests[i])
        h = torch.relu(x @ weight)
        outputs[i] = h @ weight.T
    return outputs
