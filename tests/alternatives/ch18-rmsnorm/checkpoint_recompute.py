# expect: pass
# 不写反向公式：用非 reentrant 的激活检查点包住原来的逐步计算。前向只保存输入 x 和 weight，
# 反向时重跑一遍 FP32 的计算，由自动求导算梯度；多层叠起来时，每层留下的只有 x。
import torch
from torch.utils.checkpoint import checkpoint


def _rms_norm(x, weight, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(x, weight, eps):
    return checkpoint(_rms_norm, x, weight, eps, use_reentrant=False)
