"""第 17 章 MoE 按路由分发 token（ch17-moe）.

Kind "call" (case moe): x [tokens, d], router [E, d], expert weights w_in [E, 4d, d] and w_out
[E, d, 4d] on the device; `moe_forward` returns the top-k mixture (softmax over the top-k router
logits, GELU experts), forward only. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_in, w_out, top_k):
    """让每个专家都处理全部 token，再按路由权重取需要的那几份：结果对，
    但中间激活值是 [专家数, token 数, 4d]，比实际需要的大 E / top_k 倍。"""
    logits = x @ router_weight.T                          # [T, E]
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    gates = torch.zeros_like(logits).scatter(-1, top_idx, torch.softmax(top_logits, dim=-1))
    h = F.gelu(torch.einsum("td,efd->etf", x, w_in))      # [E, T, 4d]：所有专家 × 所有 token
    y = torch.einsum("etf,edf->etd", h, w_out)            # [E, T, d]
    return torch.einsum("etd,te->td", y, gates)
'''

SOLUTION = '''\
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_in, w_out, top_k):
    """按路由分发：每个专家只处理选中它的 token，结果乘上门控权重后加回原位置。"""
    logits = x @ router_weight.T
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    top_gates = torch.softmax(top_logits, dim=-1)         # [T, k]
    out = torch.zeros_like(x)
    for e in range(w_in.shape[0]):
        token, slot = (top_idx == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = F.gelu(x[token] @ w_in[e].T)                  # 只有路由到专家 e 的 token
        out.index_add_(0, token, (h @ w_out[e].T) * top_gates[token, slot, None])
    return out
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = ExerciseSpec(
    id="ch17-moe",
    chapter=17,
    title="MoE：每个 token 只交给它的 top-k 专家",
    task=(
        "`moe_forward(x, router_weight, w_in, w_out, top_k)` 计算一个 MoE 前馈层（只做前向，推理）："
        "`x` 是 `[tokens, d]`，路由器 `router_weight` 是 `[E, d]`，专家权重 `w_in` 是 `[E, 4d, d]`、`w_out` 是 "
        "`[E, d, 4d]`，都已经在设备上。每个 token 取路由得分最高的 `top_k` 个专家，门控权重是这 `top_k` 个得分的 "
        "softmax；专家 e 的输出是 `gelu(x @ w_in[e].T) @ w_out[e].T`；结果是门控加权和。\n\n"
        "起始代码让**每个专家处理全部 token**，再用门控把没选中的那些乘成 0：结果对，但中间激活值是 "
        "`[E, tokens, 4d]`。请按路由**分发**：每个专家只处理选中它的 token，再加回原位置（`index_add_`），"
        "结果与起始代码一致。"
    ),
    function="moe_forward",
    signature="def moe_forward(x, router_weight, w_in, w_out, top_k):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=4, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="moe", d_model=256, experts=8, top_k=2, cublas_workspace=False)),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="moe", d_model=1024, experts=8, top_k=2)),
    target_ratio=0.7,
    rtol=1e-4,
    points=10,
    kind="call",
    hints=(
        "`token, slot = (top_idx == e).nonzero(as_tuple=True)` 给出选中专家 e 的 token 和它在 top-k 里的位置。",
        "`out.index_add_(0, token, 专家输出 * top_gates[token, slot, None])` 把结果加回原位置。",
    ),
)
