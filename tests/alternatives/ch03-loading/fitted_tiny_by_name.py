# expect: incorrect|exception
# 只适配公开配置：没有用评分器设置的 MODEL_NAME，而是写死了 "tiny"。公开配置能过；
# 隐藏配置换了预设，起始代码建的是另一个模型，参数个数对不上。
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"
SEED = 0


def load_model(device):
    return build_model("tiny", seed=SEED, dtype=torch.bfloat16, device=device.torch_device)
