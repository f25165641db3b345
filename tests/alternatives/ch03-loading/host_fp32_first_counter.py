# expect: too_much_memory
# 反例：把“峰值”理解成只看显存，于是先在主存里按 FP32 建好整个模型，再逐个张量转成 BF16 放到设备上。
# 显存里确实只有 BF16 的一份，但加载期间主存里放着一份 FP32 模型，是最终模型的两倍多：主存超标。
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"
SEED = 0


def load_model(device):
    with device.host():
        model = build_model(MODEL_NAME, seed=SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)          # outside device.host(): the bf16 copy is device memory
        for module in model.modules():
            for name, b in module.named_buffers(recurse=False):
                if b is not None:
                    module._buffers[name] = device.to_device(b)
    return model
