import torch


def train_step(model, optimizer, batch, device):
    """只卸载值得搬的：Transformer block 的前向为反向保存的张量拷到主存，反向用到时再拷回；
    与参数共用存储的张量（权重本来就常驻显存）原样保留；block 之外（输出层、损失）保存的张量
    在反向一开始、也就是峰值那一刻就要用，也不搬。钩子只在第一次调用时挂上。"""
    if not hasattr(model, "_offload_blocks"):
        weights = {p.untyped_storage()._cdata for p in model.parameters()}

        def pack(t):
            if t.untyped_storage()._cdata in weights:
                return t
            return (device.to_host(t),)

        def unpack(packed):
            return device.to_device(packed[0]) if isinstance(packed, tuple) else packed

        def enter(block, args):
            block._saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
            block._saved_hooks.__enter__()

        def leave(block, args, output):
            block._saved_hooks.__exit__(None, None, None)

        for block in model.transformer.h:
            block.register_forward_pre_hook(enter)
            block.register_forward_hook(leave)
        model._offload_blocks = True
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
