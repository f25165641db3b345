# expect: exception
# 只对看到的配置成立：把每个请求补齐到看到的最长长度 6144 行（写死的数），形状只剩一种；
# 算完取前 n_i 行再 clone。隐藏配置里有更长的请求，补齐时就出错了。
import torch


def process(requests, weight, device):
    outputs = []
    for x in requests:
        n = x.shape[0]
        xd = device.to_device(x)
        xp = torch.zeros(6144, x.shape[1], dtype=xd.dtype, device=xd.device)
        xp[:n] = xd
        del xd
        h = torch.relu(xp @ weight)
        outputs.append((h @ weight.T)[:n].clone())
    return outputs
