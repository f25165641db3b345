import torch


def int8_linear(x, weight_int8, scale, block_rows=256):
    """按输出通道分块反量化：每次只把 block_rows 行权重变回浮点，算完这一块输出就丢掉。
    真实的 weight-only 内核在寄存器和共享内存里按 tile 反量化，整块浮点权重从来不出现在显存里。"""
    out = torch.empty(x.shape[0], weight_int8.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, weight_int8.shape[0], block_rows):
        rows = slice(start, start + block_rows)
        block = weight_int8[rows].to(x.dtype)               # [block_rows, d_in]
        torch.matmul(x, block.T, out=out[:, rows])
        out[:, rows] *= scale[rows]                         # 每个输出通道的缩放系数最后再乘
    return out
