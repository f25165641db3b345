# expect: technique
# 反例：保留起始代码的稠密写法（所有专家 × 所有 token），只把 token 切成 64 个一块逐块计算。
# 中间张量变成 [E, 64, hidden]，峰值很低，但每个专家仍处理了全部 token：计算量没有省。
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):
    logits = x @ router_weight.T
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    gates = torch.zeros_like(logits).scatter(-1, top_idx, torch.softmax(top_logits, dim=-1))
    outs = []
    for start in range(0, x.shape[0], 64):
        xc, gc = x[start:start + 64], gates[start:start + 64]
        h = F.silu(torch.einsum("td,efd->etf", xc, w_gate)) * torch.einsum("td,efd->etf", xc, w_up)
        outs.append(torch.einsum("etd,te->td", torch.einsum("etf,edf->etd", h, w_down), gc))
    return torch.cat(outs)
