# expect: too_much_memory
# 反例（只修了一半）：知道要“直接按 BF16 建”，却为了核对数值，先在设备上按 FP32 建了一份起始代码的模型，
# 再按 BF16 建一份返回。FP32 那一份在函数返回前一直活着，显存峰值与起始代码差不多。
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"
SEED = 0


def load_model(device):
    reference = build_model(MODEL_NAME, seed=SEED, device=device.torch_device)
    model = build_model(MODEL_NAME, seed=SEED, dtype=torch.bfloat16, device=device.torch_device)
    n = sum(p.numel() for p in reference.parameters())
    assert n == sum(p.numel() for p in model.parameters())
    return model
