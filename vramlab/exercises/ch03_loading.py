"""第 3 章 加载模型不翻倍（ch03-loading）.

Kind "load": the harness resets the peak, calls `load_model(device)` and inspects what it returns:
every parameter bf16, on the device, the same values as the trusted starter's model (fixed
projections, tolerance `rtol`), and the peak while loading. `MODEL_NAME` in the learner's module
is set by the harness to this scale's preset (ci: tiny, gpu: gpt2-small) after the code is loaded.
"""
from ..grader.kinds import load
from .spec import ExerciseSpec, Scale

STARTER = '''\
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"     # 评分时会换成本规模的预设：ci 用 tiny，gpu 用 gpt2-small
SEED = 0


def load_model(device):
    """先在设备上按 fp32 建好整个模型，再转成 bf16：转换时 fp32 原件和 bf16 副本同时在显存里。"""
    model = build_model(MODEL_NAME, seed=SEED, device=device.torch_device)
    return model.to(torch.bfloat16)
'''

SOLUTION = '''\
import torch
from vramlab.models import build_model

MODEL_NAME = "tiny"     # 评分时会换成本规模的预设：ci 用 tiny，gpu 用 gpt2-small
SEED = 0


def load_model(device):
    """直接以 bf16 在设备上创建参数：显存里从来没有 fp32 的副本。
    同一个随机种子下，初始化出的值与“先 fp32 再转换”逐位相同。"""
    return build_model(MODEL_NAME, seed=SEED, dtype=torch.bfloat16, device=device.torch_device)
'''

TARGET_NOTE = ("Measured on the sim at ci scale (tiny, 593,408 params; final bf16 model 1.13 MiB): starter 2.76 MiB "
               "= 2.44x the model (fp32 weights + the bf16 copy of each tensor while .to() converts); solution "
               "1.39 MiB = 1.22x the model = 0.50x the starter (the extra 0.22x is one transient copy of the "
               "embedding during initialisation), parameters bitwise equal to the starter's. Targets: <= 1.5x the "
               "model (absolute, from the trusted run) and <= 0.70x the starter; gpt2-small's embedding is 31% of "
               "its weights, so the same transient gives about 1.31x there (estimated, not measured on a GPU). "
               "Tolerance: fingerprint relative error <= 1e-2 (measured 0 on the sim; bf16 rounding of a different "
               "RNG path would be ~1e-3, a different seed gives ~1.4).")

SPEC = ExerciseSpec(
    id="ch03-loading",
    chapter=3,
    title="加载模型：直接以 bf16 创建，峰值不翻倍",
    task=(
        "写 `load_model(device)`：用 `vramlab.models.build_model` 在设备上创建预设 `MODEL_NAME` 的模型"
        "（随机种子 `SEED = 0`），返回**所有参数都是 bf16** 的模型。\n\n"
        "起始代码先在设备上按 fp32 建好模型，再 `.to(torch.bfloat16)`：转换时 fp32 原件和 bf16 副本同时在显存里，"
        "峰值是最终模型大小的两倍多。请让峰值接近模型本身的大小：`build_model` 的 `dtype=` 参数可以让参数"
        "一创建就是 bf16。\n\n"
        "要求：\n"
        "1. 返回的模型参数全部是 `torch.bfloat16`，在设备上（`device.torch_device`）；\n"
        "2. 参数值与起始代码得到的模型相同（同一个预设、同一个种子）；\n"
        "3. 加载期间的峰值不超过最终 bf16 模型大小的 1.5 倍，且不超过起始代码峰值的 0.70 倍。\n\n"
        "`MODEL_NAME` 由评分器设置（ci 规模是 `tiny`，gpu 规模是 `gpt2-small`），函数里请使用这个变量。"
    ),
    function="load_model",
    signature="def load_model(device):",
    starter=STARTER,
    solution=SOLUTION,
    ci=Scale(model="tiny", batch=1, seq=1, steps=1, warmup=0,
             settings=load.Settings(MODEL_NAME="tiny", max_model_multiple=1.5)),
    gpu=Scale(model="gpt2-small", batch=1, seq=1, steps=1, warmup=0,
              settings=load.Settings(MODEL_NAME="gpt2-small", max_model_multiple=1.5)),
    target_ratio=0.70,
    rtol=1e-2,
    kind="load",
    points=10,
    hints=(
        "`build_model(MODEL_NAME, seed=SEED, dtype=torch.bfloat16, device=device.torch_device)`：参数一创建就是 bf16。",
        "`model.to(torch.bfloat16)` 会在转换每个张量时同时保留 fp32 原件和 bf16 副本。",
        "不要换预设或随机种子：参数值要与起始代码的模型一致。",
    ),
)
