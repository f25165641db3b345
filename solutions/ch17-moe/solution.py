import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):
    """按路由分发：每个专家只处理选中它的 token，结果乘上门控权重后加回原位置。"""
    logits = x @ router_weight.T
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    top_gates = torch.softmax(top_logits, dim=-1)                     # [T, k]
    out = torch.zeros_like(x)
    for e in range(w_gate.shape[0]):
        token, slot = (top_idx == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        xe = x[token]                                                 # 只有路由到专家 e 的 token
        h = F.silu(xe @ w_gate[e].T) * (xe @ w_up[e].T)
        out.index_add_(0, token, (h @ w_down[e].T) * top_gates[token, slot, None])
    return out
