# expect: pass
# 另一条路：先在主存里按 BF16 建好模型（同一个预设、同一个种子），再把参数和缓冲区逐个复制到设备上，
# 每搬完一个，主存里的那一份就没有引用、随即释放。显存里只有 BF16 的一份，主存最多也只有一份 BF16 模型。
# 共享的权重是同一个 Parameter 对象，parameters() 只给一次，搬完仍然共享。
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"
SEED = 0


def load_model(device):
    with device.host():
        model = build_model(MODEL_NAME, seed=SEED, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.data = device.to_device(p.data)
        for module in model.modules():
            for name, b in module.named_buffers(recurse=False):
                if b is not None:
                    module._buffers[name] = device.to_device(b)
    return model
