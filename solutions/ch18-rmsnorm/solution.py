import torch


class _RMSNorm(torch.autograd.Function):
    """只保存输入 x（原精度）和每行的 rstd（FP32，[tokens, 1]），反向时重算归一化结果。"""

    @staticmethod
    def forward(ctx, x, weight, eps):
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (h * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        h = x.float()
        n = (h * rstd).to(x.dtype)                                  # 重算归一化结果
        grad_weight = (grad_out * n).float().sum(0).to(weight.dtype)
        g = (grad_out * weight).float()                             # d loss / d n（FP32）
        dot = (g * h).mean(-1, keepdim=True)
        grad_x = (rstd * (g - h * rstd.pow(2) * dot)).to(x.dtype)
        return grad_x, grad_weight, None


def rms_norm(x, weight, eps):
    return _RMSNorm.apply(x, weight, eps)
