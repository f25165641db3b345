# expect: too_much_memory
# 半个修法：按 K/V 头循环，每组查询头配上 expand 出的 K/V 视图（不复制）调用一次 SDPA，再拼接输出。
# 前向没有复制，但反向时每组的 dK、dV 仍按查询头数算出来，拼接输出也多一份；峰值超出目标，
# 只有一个 K/V 头（MQA）时和起始代码相差无几。
import torch
import torch.nn.functional as F


def attention(q, k, v):
    b, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    outs = [F.scaled_dot_product_attention(q[:, j * groups:(j + 1) * groups],
                                           k[:, j:j + 1].expand(b, groups, seq, d),
                                           v[:, j:j + 1].expand(b, groups, seq, d), is_causal=True)
            for j in range(kv_heads)]
    return torch.cat(outs, dim=1)
