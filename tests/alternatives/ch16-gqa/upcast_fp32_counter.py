# expect: too_much_memory
# 反例：先转成 FP32 再用内核的分组查询支持，最后转回 BF16。FP32 的 q、k、v 副本比复制的 K/V 还大；
# 在真卡上 FP32 的 GQA 还会退回 math 实现。评分按 BF16 计，峰值超过起始代码。
import torch
import torch.nn.functional as F


def attention(q, k, v):
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
    return out.to(q.dtype)
