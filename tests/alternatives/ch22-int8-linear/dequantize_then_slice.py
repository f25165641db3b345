# expect: too_much_memory
# 分块抄对了、放错了地方：先把整块权重反量化成 FP32，再一块一块地取出来相乘。
# 整块浮点权重在循环之前就已经在显存里了，分块什么也没省下。
import torch


def int8_linear(x, weight_int8, scale):
    weight = weight_int8.to(x.dtype) * scale[:, None]
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, weight.shape[0], 256):
        rows = slice(start, start + 256)
        torch.matmul(x, weight[rows].T, out=out[:, rows])
    return out
