"""QLoRA's NF4 base on the simulated device: a memory stand-in for bitsandbytes' `Linear4bit`.

bitsandbytes' `Params4bit` is a tensor subclass, which FakeTensorMode cannot wrap, so a 7B-70B QLoRA
model cannot be built from the real layers there. `NF4Linear` allocates exactly what `Linear4bit`
(quant_type="nf4", compress_statistics=True, i.e. QLoRA's double quantization) keeps on the device,
and does in a matmul what `bitsandbytes.autograd._functions.MatMul4Bit` does to memory:

* storage: the packed 4-bit weight, uint8 [(in*out + 1) // 2, 1]; one 8-bit absmax per 64-weight
  block; one fp32 constant per 256 blocks (Dettmers et al. 2023, "QLoRA", Sec. 3: 4.127 bits/weight);
* forward: the layer's weight is dequantised to the compute dtype for the matmul and freed after;
  only the packed weight is saved for backward (MatMul4Bit keeps `ctx.tensors = (None, B)`);
* backward: dequantised again, input gradient = grad_output @ W, freed; no weight gradient.

The values are not computed (`torch.empty`): use it under FakeTensorMode, where there are none.
`quantized_build(...)` is `models.build_model` with every linear layer of the transformer blocks
replaced (the LM head stays 16-bit, as transformers' BitsAndBytesConfig leaves the output
embedding). Built on the meta device first, so the 16-bit weights never exist on the device.
`peft.prepare_model_for_kbit_training` (every non-quantized parameter cast to fp32) is applied by
`vramlab.runner`'s QLoRA recipe, which builds with `quantized_build`.
"""
from __future__ import annotations


import torch


class _NF4Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, out_features, in_features):
        w = torch.empty(out_features, in_features, dtype=x.dtype, device=x.device)   # dequantised
        y = torch.nn.functional.linear(x, w)
        del w
        ctx.save_for_backward(packed)
        ctx.shape = (out_features, in_features)
        return y

    @staticmethod
    def backward(ctx, grad):
        (packed,) = ctx.saved_tensors
        w = torch.empty(*ctx.shape, dtype=grad.dtype, device=grad.device)              # dequantised again
        return grad @ w, None, None, None


class NF4Linear(torch.nn.Linear):
    """Frozen 4-bit linear layer (memory only); a `torch.nn.Linear` so peft wraps it like one."""

    def __init__(self, in_features: int, out_features: int, bias: bool, bias_dtype, device=None):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        n = in_features * out_features
        blocks = -(-n // 64)
        self.weight = torch.nn.Parameter(torch.empty((n + 1) // 2, 1, dtype=torch.uint8, device=device),
                                         requires_grad=False)
        self.bias = (torch.nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device))
                     if bias else None)
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
        self.register_buffer("absmax2", torch.empty(-(-blocks // 256), dtype=torch.float32, device=device))

    def forward(self, x):
        y = _NF4Matmul.apply(x, self.weight, self.out_features, self.in_features)
        return y + self.bias if self.bias is not None else y


def _linear_shape(module) -> tuple[int, int, bool] | None:
    """(in, out, has_bias) of a torch Linear or a GPT-2 Conv1D (weight stored as in x out)."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features, module.bias is not None
    if type(module).__name__ == "Conv1D":
        i, o = module.weight.shape
        return i, o, module.bias is not None
    return None


def quantize_blocks(model) -> int:
    """Replace every linear layer except the output embedding by an NF4Linear (same device, the
    biases keep their dtype). Returns how many were replaced."""
    head = model.get_output_embeddings()
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            shape = _linear_shape(child)
            if shape is None or child is head:
                continue
            i, o, bias = shape
            setattr(parent, name, NF4Linear(i, o, bias, child.weight.dtype, device=child.weight.device))
            count += 1
    return count


def quantized_build(name: str, attention: str = "sdpa", dropout: float = 0.0, seed: int = 0, dtype=None,
                    device=None):
    """`models.build_model` with an NF4 base: built on meta, quantized, then allocated on `device`."""
    from ..models import build_model

    model = build_model(name, attention=attention, dropout=dropout, seed=seed, dtype=dtype, device="meta")
    quantize_blocks(model)
    _materialize(model, device if device is not None else torch.get_default_device())
    return model


def _materialize(model, device) -> None:
    """Give every meta parameter and buffer uninitialised storage on `device`. New Parameter objects
    rather than `to_empty`, which cannot swap a meta tensor for a fake one; a tensor shared by two
    modules (tied embeddings) stays shared."""
    new: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, t in list(module._parameters.items()):
            if t is None:
                continue
            if id(t) not in new:
                new[id(t)] = torch.nn.Parameter(torch.empty_like(t, device=device), requires_grad=t.requires_grad)
            module._parameters[name] = new[id(t)]
        for name, t in list(module._buffers.items()):
            if t is None:
                continue
            if id(t) not in new:
                new[id(t)] = torch.empty_like(t, device=device)
            module._buffers[name] = new[id(t)]
