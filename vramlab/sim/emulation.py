"""Make CPU code allocate what CUDA code would: attention kernels, dropout masks, autocast.

A `TorchFunctionMode` sees calls like `F.linear` before autograd does, so it can change *which*
computation runs and autograd still records it correctly. Four CUDA behaviours are reproduced:

1. `F.scaled_dot_product_attention` -> the CUDA kernel's memory (vramlab.sim.kernels).
2. `F.dropout` -> `torch.native_dropout`, which keeps a 1-byte bool mask as CUDA does. The CPU's
   `F.dropout` keeps a float mask: 4 bytes per element.
3. Autocast. Code enables it with `torch.autocast(device.type, dtype)`; on the simulated device
   that is `"cpu"`, but the CPU's autocast casts a different set of ops. While CPU autocast is on,
   this mode switches it off for each call and applies CUDA's policy instead (the op lists of
   aten/src/ATen/autocast_mode.cpp, CUDA column):
   - matmul-like ops run in the low-precision dtype; fp32 leaf tensors that require grad (the
     weights) are cast once and cached until the outermost autocast exits;
   - ops that need range (pow, exp, log, layer_norm, softmax, log_softmax, losses, ...) run in fp32.
   Everything else runs on whatever dtypes it receives.
4. No host view of device memory: `numpy()`, `np.asarray()` and DLPack exports of a tensor on
   the device raise CUDA's TypeError (HOST_VIEWS, patched by SimDevice); a host copy
   (`device.to_host`) has them.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .kernels import emulated_sdpa

T = torch.Tensor
LOWER_PRECISION = {
    F.linear, F.bilinear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm,
    torch.bmm, T.bmm, torch.addmm, T.addmm, torch.baddbmm, T.baddbmm, torch.addbmm, T.addbmm,
    torch.addmv, T.addmv, torch.mv, T.mv, torch.einsum, torch.chain_matmul, torch.linalg.multi_dot,
    F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.prelu,
    F.scaled_dot_product_attention,
}
FP32 = {
    torch.pow, T.pow, T.__pow__, T.__rpow__, torch.exp, T.exp, torch.log, T.log, torch.log10, T.log10,
    torch.log2, T.log2, torch.log1p, T.log1p, torch.expm1, T.expm1, torch.reciprocal, T.reciprocal,
    torch.rsqrt, T.rsqrt, torch.acos, T.acos, torch.asin, T.asin, torch.cosh, T.cosh, torch.sinh, T.sinh,
    torch.tan, T.tan, torch.erfinv, T.erfinv, F.softplus, F.layer_norm, F.group_norm,
    torch.logsumexp, T.logsumexp, torch.dist, torch.cdist, torch.renorm, F.cosine_similarity,
    F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.kl_div,
    F.binary_cross_entropy_with_logits, F.poisson_nll_loss, F.cosine_embedding_loss,
    F.hinge_embedding_loss, F.margin_ranking_loss, F.multilabel_margin_loss, F.soft_margin_loss,
    F.triplet_margin_loss, F.multi_margin_loss,
}
# "fp32_set_opt_dtype" ops: given a low-precision input they produce fp32 via their dtype argument.
FP32_OUTPUT = {
    F.softmax, T.softmax, torch.softmax, F.log_softmax, T.log_softmax, torch.log_softmax,
    torch.cumsum, T.cumsum, torch.cumprod, T.cumprod, torch.prod, T.prod, torch.sum, T.sum,
}
_LOW = (torch.float16, torch.bfloat16)
# Zero-copy host views of a tensor's memory. A CUDA tensor has none (numpy() raises, a DLPack
# capsule points at device memory no host library can read); on the simulated device the "device"
# memory is host memory, so these would let code compute in host memory the meter never sees.
# SimDevice patches these methods on the class while it is active (a function mode is off inside
# the ops it handles, where saved-tensor hooks run, so a mode could not refuse them there).
HOST_VIEWS = ("numpy", "__array__", "__dlpack__")
NO_HOST_VIEW_ZH = ("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                   "memory first.（模拟设备和真卡一样：显存里的张量不能直接变成 numpy 数组或 DLPack 导出；"
                   "先用 device.to_host(t) 拷到主存）")


def refuse_host_view(devices, t) -> None:
    """Raise CUDA's TypeError when `t` lives in the memory of one of the simulated `devices`."""
    if isinstance(t, torch.Tensor) and any(d.tracker.on_device(t) for d in devices):
        raise TypeError(NO_HOST_VIEW_ZH)


class CudaEmulation(TorchFunctionMode):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.cast_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    def clear_cast_cache(self):
        self.cast_cache.clear()

    def _to_low(self, t, dtype):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype == torch.float32):
            return t
        cacheable = t.is_leaf and t.requires_grad and not t._is_view() and torch.is_autocast_cache_enabled()
        if cacheable:
            hit = self.cast_cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
        out = t.to(dtype)
        if cacheable:
            self.cast_cache[id(t)] = (weakref.ref(t), out)
        return out

    @staticmethod
    def _to_fp32(t):
        if isinstance(t, torch.Tensor) and t.dtype in _LOW:
            return t.float()
        return t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is T.backward or func is torch.autograd.backward:
            return self._backward(func, args, kwargs)
        autocast = torch.is_autocast_enabled("cpu")
        if not autocast:
            return self._call(func, args, kwargs)
        dtype = torch.get_autocast_dtype("cpu")
        torch.set_autocast_enabled("cpu", False)
        try:
            if func in LOWER_PRECISION:
                args = tuple(self._cast_nested(a, lambda t: self._to_low(t, dtype)) for a in args)
                kwargs = {k: self._cast_nested(v, lambda t: self._to_low(t, dtype)) for k, v in kwargs.items()}
            elif func in FP32_OUTPUT:
                if kwargs.get("dtype") is None and any(isinstance(a, torch.Tensor) and a.dtype in _LOW
                                                       for a in args[:1]):
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif func in FP32:
                args = tuple(self._cast_nested(a, self._to_fp32) for a in args)
                kwargs = {k: self._cast_nested(v, self._to_fp32) for k, v in kwargs.items()}
            return self._call(func, args, kwargs)
        finally:
            torch.set_autocast_enabled("cpu", True)

    @staticmethod
    def _cast_nested(a, fn):
        if isinstance(a, (list, tuple)):
            return type(a)(fn(x) for x in a)
        return fn(a)

    def _call(self, func, args, kwargs):
        if func is F.scaled_dot_product_attention:
            return emulated_sdpa(self.device, *args, **kwargs)
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        return func(*args, **kwargs)

    def _backward(self, func, args, kwargs):
        """Run backward with this mode active: activation checkpointing re-runs the forward
        inside backward, and that recomputation must see the same CUDA kernels. (A mode is off
        inside its own handler, so calling `func` again would run the whole backward without it.)"""
        from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
        from torch.autograd.graph import _engine_run_backward

        if func is T.backward:
            names = ("gradient", "retain_graph", "create_graph", "inputs")
            opts = dict(zip(names, args[1:]), **kwargs)
            tensors, grads = (args[0],), opts.get("gradient")
        else:
            names = ("grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
            opts = dict(zip(names, args[1:]), **kwargs)
            tensors, grads = args[0], opts.get("grad_tensors")
            tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        inputs = opts.get("inputs")
        inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
        create_graph = bool(opts.get("create_graph", False))
        retain_graph = opts.get("retain_graph")
        retain_graph = create_graph if retain_graph is None else retain_graph
        with self:
            grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False)
            _engine_run_backward(tensors, grads, retain_graph, create_graph, inputs,
                                 allow_unreachable=True, accumulate_grad=True)

    @staticmethod
    def _dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0 or inplace or torch.is_inference_mode_enabled():
            return F.dropout(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]
