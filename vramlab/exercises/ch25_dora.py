"""第 25 章 用 peft 做 DoRA 微调（ch25-dora）.

Kind "finetune", like ch24-lora, with the method DoRA (`LoraConfig(use_dora=True)`): the magnitude
vector and the column norms of W + BA cost DoRA more activations than LoRA, still far below full
fine-tuning.
"""
from .spec import finetune_exercise

SOLUTION = '''\
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    """DoRA：把权重分解成幅度 m 和方向 V/‖V‖，方向用 LoRA 更新，幅度单独训练。
    初始化时 m = ‖W‖、B = 0，模型的输出与原模型相同。"""
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, use_dora=True, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])
    return get_peft_model(model, config)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = finetune_exercise(
    id="ch25-dora",
    chapter=25,
    title="DoRA：幅度与方向分开学",
    task=(
        "请用 **peft 的 DoRA**（`LoraConfig(use_dora=True)` + `get_peft_model`）包装模型。"
        "DoRA 比 LoRA 多一个幅度向量，还要在前向里算 `W + BA` 每列的范数，激活值比 LoRA 多一些，"
        "但仍然远低于全量微调。可训练参数要很少，训练几步后损失要下降，第 1 步的损失应当与全量微调相同。"
    ),
    solution=SOLUTION,
    method="dora",
    same_start=True,
    target_ratio=0.6,
    hints=(
        "与 LoRA 的写法只差一个参数：`LoraConfig(..., use_dora=True)`。",
        "`lora_dropout=0.0`，`task_type=\"CAUSAL_LM\"`；`target_modules` 写 Llama 线性层的名字（如 `q_proj`、`v_proj`）。",
        "DoRA 的额外显存随被适配的层数增长：峰值超标时先减少 `target_modules`。",
    ),
)
