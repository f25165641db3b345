"""第 17 章 MoE 按路由分发 token（ch17-moe）.

Kind "call" (case moe): x [tokens, d], router [E, d] and SwiGLU expert weights w_gate, w_up
[E, hidden, d], w_down [E, d, hidden] on the device; `moe_forward` returns the top-k mixture
(softmax over the top-k router logits, as Mixtral), forward only. Besides the peak, the grader counts
the call's matmul FLOPs (kinds/call.py, MOE_FLOP_SLACK): running every expert on every token and
masking afterwards, in one go or in a loop over experts or token chunks, is small in memory too but
does E/k x the work, and fails. cuBLAS workspaces are off at ci scale.
"""
from ..grader.kinds import call
from .spec import ExerciseSpec, Scale, Variation

STARTER = '''\
import torch
import torch.nn.functional as F


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):
    """让每个专家都处理全部 token，再用门控把没选中的乘成 0：结果对，
    但中间激活值是 [专家数, token 数, hidden]，计算量也是需要的 E / top_k 倍。"""
    logits = x @ router_weight.T                                      # [T, E]
    top_logits, top_idx = logits.topk(top_k, dim=-1)
    gates = torch.zeros_like(logits).scatter(-1, top_idx, torch.softmax(top_logits, dim=-1))
    gate = torch.einsum("td,efd->etf", x, w_gate)                     # [E, T, hidden]
    up = torch.einsum("td,efd->etf", x, w_up)
    y = torch.einsum("etf,edf->etd", F.silu(gate) * up, w_down)       # [E, T, d]
    return torch.einsum("etd,te->td", y, gates)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (512 tokens, d 256, SwiGLU hidden 512, 8 experts, top-2; cuBLAS "
               "workspaces off), torch 2.13.0+cpu, 2026-12-02, `vramlab grade ch17-moe FILE` / grade_source: starter "
               "44.55 MiB. Reference (nonzero per expert + index_add_) 0.321x peak, 0.250x FLOPs, hidden (4 experts "
               "top-1; 16 experts top-2) 0.304x and 0.180x; sort + segments 0.317x (0.297, 0.178); capacity-padded bmm "
               "0.462x peak, 0.284x FLOPs (0.409, 0.277). Refused (technique, FLOPs 1.00x > 0.375x): a loop over all "
               "experts on all tokens 0.383x peak, the dense einsum over 64-token chunks 0.381x. Target 0.65x.")

SPEC = ExerciseSpec(
    id="ch17-moe",
    chapter=17,
    title="MoE：每个 token 只交给它的 top-k 专家",
    task=(
        "`moe_forward(x, router_weight, w_gate, w_up, w_down, top_k)` 计算一个 Mixtral 式的 MoE 前馈层"
        "（只做前向，推理）：`x` 是 `[tokens, d]`，路由器 `router_weight` 是 `[E, d]`，每个专家是一个 SwiGLU 前馈网络，"
        "权重 `w_gate`、`w_up` 是 `[E, hidden, d]`，`w_down` 是 `[E, d, hidden]`，都已经在设备上。"
        "每个 token 取路由得分最高的 `top_k` 个专家，门控权重是这 `top_k` 个得分的 softmax；专家 e 的输出是 "
        "`(silu(x @ w_gate[e].T) * (x @ w_up[e].T)) @ w_down[e].T`；结果是门控加权和。\n\n"
        "起始代码让**每个专家处理全部 token**，再用门控把没选中的乘成 0：结果对，但中间激活值是 "
        "`[E, tokens, hidden]`，矩阵乘的计算量也是实际需要的 `E / top_k` 倍。请改写它：结果不变，"
        "峰值显存降到目标以下，而且专家只为选中它们的 token 做计算（评分器会数矩阵乘的计算量）。"
        "隐藏配置会换 token 数、宽度、专家数和 `top_k`。"
    ),
    function="moe_forward",
    signature="def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k):",
    starter=STARTER,
    ci=Scale(model="tiny", batch=4, seq=128, steps=1, warmup=0,
             settings=call.Settings(case="moe", d_model=256, hidden=512, experts=8, top_k=2, cublas_workspace=False),
             hidden=(
                 Variation(catches="top_k = 2 or 8 experts hard-coded (topk(2), range(8))",
                           seq=96, settings={"d_model": 128, "hidden": 256, "experts": 4, "top_k": 1}),
                 Variation(catches="8 experts hard-coded: experts 8-15 never run; FLOP share 2/16",
                           settings={"d_model": 128, "hidden": 256, "experts": 16}),
             )),
    gpu=Scale(model="gpt2-small", batch=8, seq=1024, steps=1, warmup=0,
              settings=call.Settings(case="moe", d_model=1024, hidden=2816, experts=8, top_k=2)),
    target_ratio=0.65,
    rtol=1e-4,
    points=10,
    kind="call",
    hints=(
        "起始代码的峰值来自哪几个张量？它们的第一维是什么，每个 token 真正需要其中的几份？",
        "换成“按专家循环、每个专家仍处理全部 token”，显存是降了，但计算量没有变：每个专家只该看到选中它的那些 token。"
        "怎样从 `top_idx` 里找出选中专家 e 的 token，以及专家 e 在这个 token 的 top-k 里排第几（要用它取门控权重）？",
        "对每个专家：`token, slot = (top_idx == e).nonzero(as_tuple=True)`，只对 `x[token]` 做 SwiGLU，乘上 "
        "`top_gates[token, slot, None]`，再用 `out.index_add_(0, token, ...)` 加回原位置。",
    ),
    giveaways=(r"nonzero", r"index_add", r"torch\.where\(", r"argsort"),
)
