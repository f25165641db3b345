import torch
import torch.nn.functional as F


def attention(q, k, v):
    """enable_gqa=True：内核按组读取共享的 k、v 头，不复制；反向时同组的梯度直接加到共享的头上。"""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
