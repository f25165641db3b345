# expect: too_much_memory
# 半个修复：写了 autograd.Function，却把 FP32 的输入副本存给反向（省了一次转换），
# 每层仍保存一个 x 两倍大的全尺寸张量，省下的不够。
import torch


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        n = h * rstd
        ctx.save_for_backward(h, weight, rstd)
        return weight * n.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, rstd = ctx.saved_tensors
        n = (h * rstd).to(grad_out.dtype)
        grad_weight = (grad_out * n).float().sum(0).to(weight.dtype)
        g = (grad_out * weight).float()
        dot = (g * h).mean(-1, keepdim=True)
        grad_x = (rstd * (g - h * rstd.pow(2) * dot)).to(grad_out.dtype)
        return grad_x, grad_weight, None


def rms_norm(x, weight, eps):
    return _RMSNorm.apply(x, weight, eps)
