# expect: incorrect
# 只对看到的配置成立：只存 x 和 rstd 的 autograd.Function 写对了，但均方写成“平方和除以 1024”
# （看到的 hidden）。隐藏配置的宽度不同，归一化就错了。
import torch


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).sum(-1, keepdim=True) / 1024 + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (h * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = ctx.saved_tensors
        h = x.float()
        n = (h * rstd).to(x.dtype)
        grad_weight = (grad_out * n).float().sum(0).to(weight.dtype)
        g = (grad_out * weight).float()
        dot = (g * h).sum(-1, keepdim=True) / 1024
        grad_x = (rstd * (g - h * rstd.pow(2) * dot)).to(x.dtype)
        return grad_x, grad_weight, None


def rms_norm(x, weight, eps):
    return _RMSNorm.apply(x, weight, eps)
