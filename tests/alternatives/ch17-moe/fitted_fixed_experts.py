# expect: incorrect|exception
# 只对看到的配置成立：把 8 个专家、top-2 写死（range(8)、topk(2)）。可见配置通过；隐藏配置换了专家数和
# top_k，结果就不对（或者越界出错）。
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):
    top_logits, top_idx = (x @ router_weight.T).topk(2, dim=-1)
    top_gates = torch.softmax(top_logits, dim=-1)
    out = torch.zeros_like(x)
    for e in range(8):
        token, slot = (top_idx == e).nonzero(as_tuple=True)
        xe = x[token]
        h = F.silu(xe @ w_gate[e].T) * (xe @ w_up[e].T)
        out.index_add_(0, token, (h @ w_down[e].T) * top_gates[token, slot, None])
    return out
