# expect: pass
# 另一种写法：先定出参数的 dtype（纯 BF16 时是 bfloat16，否则是 float32），用 dtype 的 itemsize
# 得到每个元素的字节数；再数每个参数在显存里有几份同形状的张量（参数、梯度，加上优化器状态）。
# 不创建任何张量。
import torch


def estimate_static_bytes(n_params, optimizer, precision):
    param_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if optimizer == "adamw":
        copies = 4
    elif optimizer == "sgdm":
        copies = 3
    else:
        copies = 2
    return int(n_params) * param_dtype.itemsize * copies
