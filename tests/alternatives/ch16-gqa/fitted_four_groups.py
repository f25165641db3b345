# expect: incorrect|exception
# 只对看到的配置成立：折叠查询行的写法，但把组大小写死成 4（看到的配置是 8 个查询头、2 个 K/V 头）。
# 隐藏配置换了头数和 K/V 头数，掩码的行数对不上，出错。
import torch
import torch.nn.functional as F


def attention(q, k, v):
    b, heads, seq, d = q.shape
    pos = torch.arange(seq, device=q.device)
    mask = (pos[None, :] <= pos[:, None]).repeat(4, 1)
    out = F.scaled_dot_product_attention(q.reshape(b, k.shape[1], -1, d), k, v, attn_mask=mask)
    return out.reshape(b, heads, seq, d)
