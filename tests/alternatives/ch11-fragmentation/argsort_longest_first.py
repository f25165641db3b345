# expect: pass
# 先处理最长的请求，处理顺序用 torch.argsort 从长度向量里求出（降序），结果按原下标放回；
# 每个请求用完就 del 掉自己的输入和中间结果。
import torch


def process(requests, weight, device):
    lengths = torch.tensor([r.shape[0] for r in requests])
    outputs = [None] * len(requests)
    for i in torch.argsort(lengths, descending=True).tolist():
        x = device.to_device(requests[i])
        h = torch.relu(x @ weight)
        outputs[i] = h @ weight.T
        del x, h
    return outputs
