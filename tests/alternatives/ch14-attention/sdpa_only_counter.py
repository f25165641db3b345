# expect: incorrect
# 反例：照旧一行 SDPA。融合内核不做分数软上限（softcap · tanh(分数 / softcap)），显存很低，
# 但输出和梯度都和起始代码不同，评分器以"结果不一致"判它不通过。
import torch.nn.functional as F


def attention(q, k, v, softcap):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
