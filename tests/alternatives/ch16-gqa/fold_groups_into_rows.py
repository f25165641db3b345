# expect: pass
# 不用 GQA 参数：把同组的查询头折叠成更多的查询行。q 视为 [batch, kv_heads, 组大小 × seq, head_dim]，
# 每个 K/V 头对应一组查询行；因果掩码按每行的真实位置（行号 mod seq）构造成 [组大小 × seq, seq] 的布尔矩阵。
# 带显式掩码走 memory-efficient 内核，不复制 K/V，只多一个掩码和一次输出重排。
import torch
import torch.nn.functional as F


def attention(q, k, v):
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    pos = torch.arange(seq, device=q.device)
    mask = (pos[None, :] <= pos[:, None]).repeat(groups, 1)          # [groups * seq, seq]
    out = F.scaled_dot_product_attention(q.reshape(b, kv_heads, groups * seq, d), k, v, attn_mask=mask)
    return out.reshape(b, heads, seq, d)
