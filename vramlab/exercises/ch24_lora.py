"""第 24 章 用 peft 做 LoRA 微调（ch24-lora）.

Kind "finetune": `prepare_model(model)` gets the grader's Llama (random weights, on the device, every
parameter trainable) and returns the model to fine-tune; the grader trains it (AdamW over the
parameters that require grad) and measures the steady peak. The starter is full fine-tuning.
"""
from .spec import finetune_exercise

SOLUTION = '''\
from peft import LoraConfig, get_peft_model


def prepare_model(model):
    """LoRA：冻结基座，只在注意力和 MLP 的线性层旁边加秩为 r 的 B·A 旁路。
    B 初始化为 0，所以一开始模型的输出与原模型完全相同。"""
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                        "gate_proj", "up_proj", "down_proj"])
    return get_peft_model(model, config)
'''

TARGET_NOTE = "Measured on the sim at ci scale: see `vramlab grade-bench --starters`."

SPEC = finetune_exercise(
    id="ch24-lora",
    chapter=24,
    title="LoRA：冻结基座，只训练低秩旁路",
    task=(
        "请用 **peft 的 LoRA**（`LoraConfig` + `get_peft_model`）包装这个模型：基座冻结，只训练低秩旁路。"
        "可训练参数要很少，训练几步后损失要下降；LoRA 的 B 矩阵初始化为 0，所以第 1 步的损失应当与全量微调完全相同。"
        "Llama 的线性层名字是 `q_proj`、`k_proj`、`v_proj`、`o_proj`、`gate_proj`、`up_proj`、`down_proj`。"
    ),
    solution=SOLUTION,
    method="lora",
    same_start=True,
    target_ratio=0.5,
    hints=(
        "`from peft import LoraConfig, get_peft_model`，然后 `return get_peft_model(model, LoraConfig(...))`。",
        "`target_modules` 写线性层的名字；`task_type=\"CAUSAL_LM\"`。",
        "`lora_dropout=0.0`：本题比较第 1 步的损失，随机丢弃会让结果不可复现。",
    ),
)
