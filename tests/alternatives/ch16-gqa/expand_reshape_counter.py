# expect: too_much_memory
# 反例：Hugging Face 的 repeat_kv 写法，先 expand 成视图再 reshape 成 heads 个头。
# reshape 遇到非连续的视图会复制，和 repeat_interleave 一样占显存。
import torch
import torch.nn.functional as F


def attention(q, k, v):
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    k = k[:, :, None].expand(b, kv_heads, groups, seq, d).reshape(b, heads, seq, d)
    v = v[:, :, None].expand(b, kv_heads, groups, seq, d).reshape(b, heads, seq, d)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
