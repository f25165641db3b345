# expect: pass
# 另一种挑法：卸载钩子包住整个前向，但 pack 自己判断搬不搬：指向某个参数内存（data_ptr 相同，包括
# 转置后的视图）的张量不搬；最后一个 block 的前向结束之后（ln_f、输出层、损失）保存的张量也不搬，
# 它们在反向一开始就要用到。每步都重新登记这个开关。
import torch


def train_step(model, optimizer, batch, device):
    weights = {p.data_ptr() for p in model.parameters()}
    past_blocks = [False]

    def after_last_block(module, args, output):
        past_blocks[0] = True

    def pack(t):
        if past_blocks[0] or t.data_ptr() in weights:
            return t
        return (device.to_host(t),)

    def unpack(packed):
        return device.to_device(packed[0]) if isinstance(packed, tuple) else packed

    handle = model.transformer.h[-1].register_forward_hook(after_last_block)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = model(input_ids=batch, labels=batch).loss
    finally:
        handle.remove()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()
