# expect: incorrect|exception
# 只对看到的配置成立：按输出通道分块的写法是对的，但循环写成 range(0, 4096, 256)（看到的 d_out）。
# 隐藏配置的输出维更大，后面那些输出列从来没有被写过。
import torch


def int8_linear(x, weight_int8, scale):
    out = torch.empty(x.shape[0], weight_int8.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, 4096, 256):
        rows = slice(start, start + 256)
        torch.matmul(x, weight_int8[rows].to(x.dtype).T, out=out[:, rows])
        out[:, rows] *= scale[rows]
    return out
