# expect: too_much_memory
# 半个修复：利用缩放系数按输出通道、最后再乘到输出上，省掉了“乘缩放系数”那一份临时张量；
# 可整块 INT8 权重还是一次反量化成了 FP32（INT8 的 4 倍大），峰值仍被它占着。
import torch


def int8_linear(x, weight_int8, scale):
    return (x @ weight_int8.to(x.dtype).T) * scale
