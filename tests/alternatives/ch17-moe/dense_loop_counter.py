# expect: technique
# 反例：按专家循环，但每个专家仍处理全部 token，再乘门控（没选中的为 0）。一次只留一个专家的
# [T, hidden]，显存降到了目标以下；可计算量和起始代码一样，是需要的 E / top_k 倍，评分器按计算量判它不通过。
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):
    logits = x @ router_weight.T
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    gates = torch.zeros_like(logits).scatter(-1, top_idx, torch.softmax(top_logits, dim=-1))
    out = torch.zeros_like(x)
    for e in range(w_gate.shape[0]):
        h = F.silu(x @ w_gate[e].T) * (x @ w_up[e].T)
        out += (h @ w_down[e].T) * gates[:, e:e + 1]
    return out
